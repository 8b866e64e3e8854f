// vercel_ai_responses.mjs - the Vercel AI SDK's own OpenAI provider (`@ai-sdk/openai`), whose
// default model talks to /v1/responses: what people get from `createOpenAI({ baseURL })`
// pointed at a local server.  generateText, streamText, generateObject, tool calls.
// The provider passes no inferd extension (ignore_eos), so the synthetic test model may stop
// early: lengths are checked against the usage, not against maxOutputTokens.
import assert from 'node:assert/strict';
import { generateObject, generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { z } from 'zod';
import { twoStepToolCall } from './ai_sdk_tools.mjs';
import { apiKey, baseURL, finish, modelId, pass } from './harness.mjs';

const openai = createOpenAI({ baseURL, apiKey });
const model = openai(await modelId()); // the Responses API model
const common = { model, temperature: 0, maxRetries: 0 };
const prompt = 'Tell me a story.';
let text = null;

await pass('generateText (responses)', async () => {
  const r = await generateText({ ...common, prompt, maxOutputTokens: 6 });
  assert.equal(typeof r.text, 'string');
  assert.ok(['length', 'stop'].includes(r.finishReason), r.finishReason);
  assert.ok(r.usage.outputTokens >= 1 && r.usage.outputTokens <= 6);
  assert.ok(r.usage.inputTokens > 0);
  text = r.text;
});

await pass('streamText (responses events)', async () => {
  const r = streamText({ ...common, prompt, maxOutputTokens: 6 });
  let streamed = '';
  for await (const delta of r.textStream) streamed += delta;
  assert.equal(streamed, text);
  assert.equal(await r.text, text);
  assert.ok((await r.usage).outputTokens >= 1);
});

await pass('generateText with a system message and a conversation', async () => {
  const r = await generateText({
    ...common, maxOutputTokens: 4, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'More?' }],
  });
  assert.equal(typeof r.text, 'string');
});

await pass('generateObject with a schema (text.format json_schema)', async () => {
  const r = await generateObject({
    ...common, maxOutputTokens: 128, prompt: 'A city and its country.',
    // The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
    // JSON Schema's maxLength (what the grammar enforces) counts characters.
    schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/), country: z.string().regex(/^[A-Za-z ]{1,12}$/) }),
  });
  assert.equal(typeof r.object.city, 'string');
});

await pass('tool calls, executed, and the next step answers (function_call_output sent back)', async () => {
  await twoStepToolCall(common);
});

await pass('server errors reach the caller', async () => {
  await assert.rejects(generateText({ ...common, prompt, temperature: 5, maxOutputTokens: 2 }),
    (err) => err.statusCode === 400 && /temperature/.test(err.message));
});

finish('vercel-ai-responses');
