// vercel_ai.mjs - a scripted session through the Vercel AI SDK (`ai`) and its OpenAI-compatible
// provider (`@ai-sdk/openai-compatible`), the way people put it in front of a local server:
// generateText, streamText (with usage), generateObject with a schema and tool calls (the last
// two expected-to-fail until their issues land).
import assert from 'node:assert/strict';
import { generateObject, generateText, streamText, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';
import { ISSUE, apiKey, baseURL, finish, modelId, pass, xfail } from './harness.mjs';

const inferd = createOpenAICompatible({
  name: 'inferd',
  baseURL,
  apiKey,
  includeUsage: true, // stream_options.include_usage on streamed requests
  supportsStructuredOutputs: true, // a schema goes out as response_format json_schema
});
const model = inferd(await modelId());
// ignore_eos (an inferd extension, passed through as provider options): the synthetic test
// model may emit EOS at once.
const common = { model, temperature: 0, maxRetries: 0, providerOptions: { inferd: { ignore_eos: true } } };
const prompt = 'Tell me a story.';
let text = null;

await pass('generateText', async () => {
  const r = await generateText({ ...common, prompt, maxOutputTokens: 6 });
  assert.equal(typeof r.text, 'string');
  assert.equal(r.finishReason, 'length');
  assert.equal(r.usage.outputTokens, 6);
  assert.ok(r.usage.inputTokens > 0);
  text = r.text;
});

await pass('generateText with a system message and a conversation', async () => {
  const r = await generateText({
    ...common, maxOutputTokens: 4, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'More?' }],
  });
  assert.equal(r.usage.outputTokens, 4);
});

await pass('streamText (textStream, usage)', async () => {
  const r = streamText({ ...common, prompt, maxOutputTokens: 6 });
  let streamed = '';
  for await (const delta of r.textStream) streamed += delta;
  assert.equal(streamed, text);
  assert.equal(await r.text, text);
  assert.equal(await r.finishReason, 'length');
  assert.equal((await r.usage).outputTokens, 6);
});

await pass('server errors reach the caller', async () => {
  await assert.rejects(generateText({ ...common, prompt, temperature: 5, maxOutputTokens: 2 }),
    (err) => err.statusCode === 400 && /temperature/.test(err.message));
});

await pass('generateObject with a schema', async () => {
  const r = await generateObject({
    ...common, maxOutputTokens: 128, prompt: 'A city and its country.',
    // The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
    // JSON Schema's maxLength (what the grammar enforces) counts characters.
    schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/), country: z.string().regex(/^[A-Za-z ]{1,12}$/) }),
  });
  assert.equal(typeof r.object.city, 'string');
});

await pass('tool calls (generateText with tools, toolChoice required)', async () => {
  const r = await generateText({
    ...common, maxOutputTokens: 128, prompt: 'What is the weather in Paris?', toolChoice: 'required',
    tools: {
      weather: tool({
        description: 'The weather in a city',
        inputSchema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }),
        execute: async ({ city }) => ({ city, celsius: 21 }),
      }),
    },
  });
  assert.equal(r.toolCalls.length, 1);
  assert.equal(r.toolCalls[0].toolName, 'weather');
  assert.equal(typeof r.toolCalls[0].input.city, 'string');
});

finish('vercel-ai');
