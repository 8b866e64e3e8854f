// langgraph.mjs - LangGraph's prebuilt ReAct agent (createReactAgent) on LangChain's ChatOpenAI
// pointed at inferd: a conversation holding a tool round trip (an assistant turn of tool calls
// only, then the tool's result: issue 33's content-null turn), the agent's next step, and its
// structured final response (responseFormat: response_format json_schema), invoked and streamed.
import assert from 'node:assert/strict';
import { z } from 'zod/v3';
import { ChatOpenAI } from '@langchain/openai';
import { tool } from '@langchain/core/tools';
import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages';
import { createReactAgent } from '@langchain/langgraph/prebuilt';
import { apiKey, baseURL, finish, modelId, pass } from '../harness.mjs';
import { answerBias, toolLog } from './common.mjs';

const model = await modelId();
const bias = await answerBias();
const llm = new ChatOpenAI({
  model, apiKey, configuration: { baseURL }, temperature: 0.8, maxTokens: 60, maxRetries: 0,
  modelKwargs: { seed: 5, logit_bias: bias },
});
const getWeather = tool(async ({ city }) => {
  toolLog.push(['get_weather', city]);
  return `sunny in ${city}`;
// The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
// JSON Schema's maxLength (what the grammar enforces) counts characters.
}, { name: 'get_weather', description: 'Current weather of a city.', schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) });
const Final = z.object({ answer: z.string().regex(/^[A-Za-z ]{1,20}$/) });
const agent = createReactAgent({ llm, tools: [getWeather], responseFormat: Final });

const history = () => [
  new HumanMessage('What is the weather in Oslo?'),
  new AIMessage({ content: '', tool_calls: [{ id: 'call_1', name: 'get_weather', args: { city: 'Oslo' } }] }),
  new ToolMessage({ tool_call_id: 'call_1', content: 'sunny, 21 C' }),
];

await pass('createReactAgent: tool round trip in the history, structured response', async () => {
  const out = await agent.invoke({ messages: history() }, { recursionLimit: 8 });
  assert.ok(out.messages.length >= 4, `messages ${out.messages.length}`);
  assert.equal(typeof out.structuredResponse.answer, 'string');
});

await pass('createReactAgent: streamed (values)', async () => {
  let last;
  for await (const state of await agent.stream({ messages: history() }, { streamMode: 'values', recursionLimit: 8 })) last = state;
  assert.ok(last && last.messages.length >= 4);
  assert.equal(typeof last.structuredResponse.answer, 'string');
});

await pass('createReactAgent: a forced call runs the tool (bound tool_choice), then stops at the limit', async () => {
  const forced = createReactAgent({ llm: llm.bindTools([getWeather], { tool_choice: 'get_weather' }), tools: [getWeather] });
  const before = toolLog.length;
  await assert.rejects(forced.invoke({ messages: [new HumanMessage('Weather in Oslo?')] }, { recursionLimit: 4 }),
    /Recursion limit/);
  assert.ok(toolLog.length > before, 'the tool ran with the arguments the grammar wrote');
  assert.equal(typeof toolLog.at(-1)[1], 'string');
});

finish(`langgraph (${process.env.INFERD_TEMPLATE ?? ''})`);
