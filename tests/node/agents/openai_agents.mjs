// openai_agents.mjs - the OpenAI Agents SDK (@openai/agents) against inferd, in its
// Responses mode (its default) and its Chat Completions mode (argv[2]: responses | chat): an
// agent with two tools, an outputType and a forced first tool call (modelSettings.toolChoice),
// run and streamed, with the tool round trip in between (issue 33: the pair tool_choice +
// response_format was a 400, content null broke the Qwen3 template).
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { z } from 'zod';
import { Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, run, setTracingDisabled, tool } from '@openai/agents';
import { apiKey, baseURL, finish, modelId, pass } from '../harness.mjs';
import { answerBias, toolLog } from './common.mjs';

const mode = process.argv[2] ?? 'responses';
setTracingDisabled(true);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const name = await modelId();
const model = mode === 'chat' ? new OpenAIChatCompletionsModel(client, name) : new OpenAIResponsesModel(client, name);

const getWeather = tool({
  name: 'get_weather',
  description: 'Current weather of a city.',
  // The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
  // JSON Schema's maxLength (what the grammar enforces) counts characters.
  parameters: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }),
  execute: async ({ city }) => {
    toolLog.push(['get_weather', city]);
    return `sunny, 21 C in ${city}`;
  },
});
const add = tool({
  name: 'add',
  description: 'Adds two integers.',
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  execute: async ({ a, b }) => {
    toolLog.push(['add', a, b]);
    return String(a + b);
  },
});
const Final = z.object({ answer: z.string().regex(/^[A-Za-z ]{1,20}$/) });

function agent(toolChoice, seed, bias) {
  return new Agent({
    name: 'weather',
    instructions: 'Answer with the weather. Use the tools.',
    model,
    tools: [getWeather, add],
    outputType: Final,
    modelSettings: { toolChoice, temperature: 0.8, maxTokens: 80, providerData: { seed, logit_bias: bias } },
  });
}

const bias = await answerBias();
assert.ok(Object.keys(bias).length > 0, 'no single token for "{"');

for (const [i, toolChoice] of [['required', 1], ['get_weather', 2]].entries()) {
  const [choice, seed] = [toolChoice[0], toolChoice[1]];
  await pass(`${mode}: run, forced first call (${choice}), outputType`, async () => {
    const before = toolLog.length;
    const result = await run(agent(choice, seed, bias), 'What is the weather in Oslo?', { maxTurns: 5 });
    const called = toolLog.slice(before);
    assert.ok(called.length >= 1, 'the forced first call ran a tool');
    if (choice === 'get_weather') assert.equal(called[0][0], 'get_weather');
    assert.equal(typeof result.finalOutput.answer, 'string');
    // the round trip: the tool's output went back to the model as the next turn's input
    const items = result.newItems.map((it) => it.type);
    assert.ok(items.includes('tool_call_item') && items.includes('tool_call_output_item'), `items ${items}`);
  });
  await pass(`${mode}: streamed, forced first call (${choice}), outputType`, async () => {
    const before = toolLog.length;
    const stream = await run(agent(choice, seed + 10 * (i + 1), bias), 'Weather in Oslo, please.', { stream: true, maxTurns: 5 });
    const kinds = new Set();
    for await (const ev of stream) kinds.add(ev.type === 'run_item_stream_event' ? ev.name : ev.type);
    await stream.completed;
    assert.ok(toolLog.length > before, 'a tool ran');
    assert.ok(kinds.has('tool_called') && kinds.has('tool_output'), `events ${[...kinds]}`);
    assert.equal(typeof stream.finalOutput.answer, 'string');
  });
}

finish(`openai-agents (${mode})`);
