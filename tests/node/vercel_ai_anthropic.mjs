// vercel_ai_anthropic.mjs - the Vercel AI SDK's Anthropic provider (`@ai-sdk/anthropic`,
// `createAnthropic({ baseURL })`) against /v1/messages: generateText, streamText (its usage from
// message_start and message_delta), thinking as reasoning, a tool call executed and answered
// in a second step (tool_use sent back with its tool_result), a streamed forced call, and an
// image refused by name.
// The provider passes no inferd extension (ignore_eos), so the synthetic test model may stop
// early: lengths are checked against the usage, not against maxOutputTokens.
import assert from 'node:assert/strict';
import { generateText, streamText } from 'ai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { twoStepToolCall, weatherTool } from './ai_sdk_tools.mjs';
import { apiKey, baseURL, finish, modelId, pass } from './harness.mjs';

// The provider's baseURL ends in /v1 (it appends /messages), as the harness's does.
const anthropic = createAnthropic({ baseURL, apiKey });
const model = anthropic(await modelId());
const common = { model, temperature: 0, maxRetries: 0 };
const prompt = 'Tell me a story.';
let text = null;
let inputTokens = 0;

await pass('generateText (messages)', async () => {
  const r = await generateText({ ...common, prompt, maxOutputTokens: 6 });
  assert.equal(typeof r.text, 'string');
  assert.ok(['length', 'stop'].includes(r.finishReason), r.finishReason);
  assert.ok(r.usage.outputTokens >= 1 && r.usage.outputTokens <= 6);
  assert.ok(r.usage.inputTokens > 0);
  assert.match(r.response.id, /^msg_/);
  text = r.text;
  inputTokens = r.usage.inputTokens;
});

await pass('streamText (messages events): the same text and usage', async () => {
  const r = streamText({ ...common, prompt, maxOutputTokens: 6 });
  let streamed = '';
  for await (const delta of r.textStream) streamed += delta;
  assert.equal(streamed, text);
  assert.equal(await r.text, text);
  const u = await r.usage;
  assert.ok(u.outputTokens >= 1);
  assert.equal(u.inputTokens, inputTokens);
});

await pass('generateText with a system prompt and a conversation', async () => {
  const r = await generateText({
    ...common, maxOutputTokens: 4, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' }, { role: 'user', content: 'More?' }],
  });
  assert.equal(typeof r.text, 'string');
  assert.ok(r.usage.inputTokens > inputTokens);
});

await pass('thinking enabled: reasoning (generated and streamed)', async () => {
  // The provider adds the budget to max_tokens and drops temperature (so the text is sampled);
  // the test template opens <think> when asked, so a short reply is all reasoning.
  const args = {
    ...common, prompt, maxOutputTokens: 8,
    providerOptions: { anthropic: { thinking: { type: 'enabled', budgetTokens: 8 } } },
  };
  const r = await generateText(args);
  assert.equal(typeof r.reasoningText, 'string');
  assert.ok(r.reasoningText.length > 0, 'no reasoning');
  assert.equal(r.text, '');
  const s = streamText(args);
  let reasoning = '';
  for await (const part of s.fullStream) if (part.type === 'reasoning-delta') reasoning += part.text;
  assert.ok(reasoning.length > 0, 'no streamed reasoning');
  assert.equal(reasoning, await s.reasoningText);
});

await pass('a tool call, executed, and the next step answers (tool_result sent back)', async () => {
  const call = await twoStepToolCall(common);
  assert.match(call.toolCallId, /^toolu_/);
});

await pass('a streamed tool call (input_json_delta)', async () => {
  const r = streamText({
    ...common, maxOutputTokens: 128, prompt: 'What is the weather in Rome?',
    toolChoice: { type: 'tool', toolName: 'weather' },
    tools: { weather: weatherTool(false) },
  });
  const calls = await r.toolCalls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].toolName, 'weather');
  assert.equal(typeof calls[0].input.city, 'string');
  assert.equal(await r.finishReason, 'tool-calls');
});

await pass('server errors reach the caller (an image: a 400 naming it)', async () => {
  // (the provider clamps a bad temperature itself, so an image is what reaches the server)
  const image = { type: 'image', image: new Uint8Array([137, 80, 78, 71]), mediaType: 'image/png' };
  await assert.rejects(
    generateText({ ...common, maxOutputTokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: 'What is it?' }, image] }] }),
    (err) => err.statusCode === 400 && /'image' content blocks are not supported/.test(err.message));
});

finish('vercel-ai-anthropic');
