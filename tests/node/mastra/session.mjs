// session.mjs - a Mastra Agent (@mastra/core) pointed at inferd, through the AI SDK's
// OpenAI-compatible provider and through Mastra's own model router ({ id, url, apiKey }): two
// tools, a forced first call (toolChoice; prepareStep hands the choice back to the model after
// it), the tool's result sent back in the next step, and structuredOutput, generated and
// streamed (issue 33: tools + structuredOutput sent tool_choice with response_format, a 400;
// content null broke the Qwen3 template; Mastra never asks for stream usage, so the server runs
// with --always-include-usage and the streams report it); server errors as the caller sees
// them; structuredOutput through a separate structuring model (Mastra's second request).
//
// Mastra 0.x and 1.x are separate npm projects (v0/, v1/: 1.x needs Node 22); each one's
// mastra.mjs imports its own packages and runs this session with them.
import assert from 'node:assert/strict';
import { apiKey, baseURL, finish, modelId, pass } from '../harness.mjs';
import { answerBias, toolLog } from '../agents/common.mjs';

/**
 * Run the session. deps: { Agent, createTool, createOpenAICompatible, z } from the project's
 * packages, toolInput(args) the tool's input from what Mastra passes execute (0.x: the input
 * under .context, 1.x: the input itself) and version, for the log lines.
 */
export async function mastraSession({ Agent, createTool, createOpenAICompatible, z, toolInput, version }) {
  const name = await modelId();
  const bias = await answerBias();
  assert.ok(Object.keys(bias).length > 0, 'no single token for "{"');

  // The provider is named "inferd" both ways, so providerOptions.inferd reaches the request.
  // Strings the model writes are bounded by a pattern, not maxLength: JSON Schema's maxLength
  // (the grammar's) counts code points, zod's max() UTF-16 units, so a random model's emoji
  // could pass the one and fail the other.
  const city = z.string().regex(/^[A-Za-z ]{1,8}$/);

  const models = {
    'openai-compatible': createOpenAICompatible({ name: 'inferd', baseURL, apiKey, supportsStructuredOutputs: true })(name),
    router: { id: `inferd/${name}`, url: baseURL, apiKey },
  };

  const getWeather = createTool({
    id: 'get_weather',
    description: 'Current weather of a city.',
    inputSchema: z.object({ city }),
    execute: async (arg) => {
      const { city } = toolInput(arg);
      toolLog.push(['get_weather', city]);
      return `sunny, 21 C in ${city}`;
    },
  });
  const add = createTool({
    id: 'add',
    description: 'Adds two integers.',
    inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
    execute: async (arg) => {
      const { a, b } = toolInput(arg);
      toolLog.push(['add', a, b]);
      return String(a + b);
    },
  });
  const Final = z.object({ answer: z.string().regex(/^[A-Za-z ,.]{1,12}$/) });

  function agent(model) {
    return new Agent({
      name: 'weather',
      instructions: 'Answer with the weather. Use the tools.',
      model,
      tools: { get_weather: getWeather, add },
    });
  }

  // The first step is forced (a call by grammar); afterwards tools + auto + the response format
  // is "a call or the schema's answer", and the bias toward '{' picks the answer.
  function options(toolChoice, seed) {
    return {
      maxSteps: 4,
      toolChoice,
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? toolChoice : 'auto' }),
      structuredOutput: { schema: Final },
      modelSettings: { temperature: 0.8, maxOutputTokens: 80, maxRetries: 0 },
      providerOptions: { inferd: { seed, logit_bias: bias } },
    };
  }

  /** The tools this run called: at least one, get_weather first when it was the forced one. */
  function checkCalls(before, choice) {
    const called = toolLog.slice(before);
    assert.ok(called.length >= 1, 'the forced first call ran a tool');
    if (typeof choice !== 'string') assert.equal(called[0][0], choice.toolName);
    for (const [tool, ...args] of called) {
      if (tool === 'get_weather') city.parse(args[0]);
      else assert.ok(Number.isInteger(args[0]) && Number.isInteger(args[1]), `add ${args}`);
    }
  }

  // Each way to the model with one of the two forced choices: a tool loop is some 50 tokens
  // under a grammar, slow in the sanitizer build, so the session runs four, not all eight.
  let seed = 1;
  const loops = [['openai-compatible', 'required'], ['router', { type: 'tool', toolName: 'get_weather' }]];
  for (const [via, choice] of loops) {
    const a = agent(models[via]);
    const label = `${via}, forced first call (${typeof choice === 'string' ? choice : choice.toolName})`;
    await pass(`generate: ${label}, structuredOutput`, async () => {
      const before = toolLog.length;
      const r = await a.generate('What is the weather in Oslo?', options(choice, seed++));
      checkCalls(before, choice);
      assert.ok(r.steps.length >= 2, `steps ${r.steps.length}`);
      const results = r.steps.flatMap((s) => s.toolResults ?? s.content.filter((c) => c.type === 'tool-result'));
      assert.ok(results.length >= 1, 'a tool result in the steps');
      assert.equal(r.steps.at(-1).finishReason, 'stop');
      Final.parse(r.object);
    });
    await pass(`stream: ${label}, structuredOutput, usage`, async () => {
      const before = toolLog.length;
      const s = await a.stream('Weather in Oslo, please.', options(choice, seed++));
      const kinds = new Set();
      for await (const chunk of s.fullStream) kinds.add(chunk.type);
      checkCalls(before, choice);
      for (const k of ['tool-call', 'tool-result', 'step-finish', 'object-result', 'finish']) assert.ok(kinds.has(k), `chunks ${[...kinds]}`);
      Final.parse(await s.object);
      // two requests' usage (the call, then the answer), which the server only sends because
      // of --always-include-usage
      const usage = await s.totalUsage;
      assert.ok(usage.inputTokens > 0 && usage.outputTokens > 0, `usage ${JSON.stringify(usage)}`);
    });
  }

  await pass('server errors reach the caller (generate rejects, stream ends on an error chunk)', async () => {
    const a = agent(models['openai-compatible']);
    const bad = { modelSettings: { temperature: 5, maxRetries: 0 } };
    await assert.rejects(a.generate('Hi', bad), (err) => err.statusCode === 400 && /temperature/.test(err.message));
    const s = await a.stream('Hi', bad);
    const errors = [];
    for await (const chunk of s.fullStream) if (chunk.type === 'error') errors.push(chunk.payload.error);
    assert.equal(errors.length, 1);
    assert.match(String(errors[0].message ?? errors[0]), /temperature/);
  });

  await pass('generate: router, structuredOutput through a structuring model (a second request)', async () => {
    const City = z.object({ city });
    const r = await agent(models.router).generate('A city, please.', {
      toolChoice: 'none', maxSteps: 1, structuredOutput: { schema: City, model: models.router },
      modelSettings: { temperature: 0.8, maxOutputTokens: 20, maxRetries: 0 }, providerOptions: { inferd: { seed: seed++ } },
    });
    assert.equal(typeof r.text, 'string');
    assert.equal(typeof City.parse(r.object).city, 'string');
  });

  finish(`mastra ${version} (${process.env.INFERD_TEMPLATE ?? ''})`);
}
