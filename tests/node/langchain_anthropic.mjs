// langchain_anthropic.mjs - LangChain JS's ChatAnthropic (`@langchain/anthropic`) with the
// server as its baseURL (clientOptions.baseURL, the Anthropic SDK it wraps): invoke, stream
// (usage from message_start and message_delta), batch, bindTools with a forced and an `any`
// tool call, a ToolMessage answered, withStructuredOutput, thinking, and server errors.
// ChatAnthropic sends top_k: -1 and top_p: -1 when they are not set (its "unset"), which the
// server reads as unset too.
import assert from 'node:assert/strict';
import { ChatAnthropic } from '@langchain/anthropic';
import { HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';
import { z } from 'zod';
import { apiKey, baseURL, finish, modelId, pass } from './harness.mjs';

const MODEL = await modelId();
const root = baseURL.replace(/\/v1\/?$/, ''); // the Anthropic SDK appends /v1/messages
const chatModel = (extra = {}) => new ChatAnthropic({
  model: MODEL,
  apiKey,
  clientOptions: { baseURL: root, maxRetries: 0 },
  temperature: 0,
  maxTokens: 5,
  maxRetries: 0,
  // ignore_eos (an inferd extension): the synthetic test model may emit EOS at once.
  invocationKwargs: { ignore_eos: true },
  ...extra,
});
const llm = chatModel();
const messages = [new SystemMessage('Be brief.'), new HumanMessage('Hi there')];
let text = null;
let inputTokens = 0;

await pass('invoke', async () => {
  const m = await llm.invoke(messages);
  assert.equal(typeof m.content, 'string');
  assert.equal(m.response_metadata.stop_reason, 'max_tokens');
  assert.equal(m.usage_metadata.output_tokens, 5);
  assert.ok(m.usage_metadata.input_tokens > 0);
  text = m.content;
  inputTokens = m.usage_metadata.input_tokens;
});

await pass('stream (chunks concatenate, usage from message_start and message_delta)', async () => {
  let full = null;
  for await (const chunk of await llm.stream(messages)) full = full ? full.concat(chunk) : chunk;
  assert.equal(full.content, text);
  assert.equal(full.usage_metadata?.output_tokens, 5);
  assert.equal(full.usage_metadata?.input_tokens, inputTokens);
});

await pass('batch', async () => {
  const rs = await llm.batch([messages, [new HumanMessage('Another one')]]);
  assert.equal(rs.length, 2);
  assert.equal(rs[0].content, text);
});

// The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
// JSON Schema's maxLength (what the grammar enforces) counts characters.
const weather = { name: 'get_weather', description: 'The weather in a city', schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) };

await pass('bindTools: a forced call, its ToolMessage answered', async () => {
  const ask = new HumanMessage('What is the weather in Paris?');
  const m = await chatModel({ maxTokens: 128 }).bindTools([weather], { tool_choice: 'get_weather' }).invoke([ask]);
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].name, 'get_weather');
  assert.match(m.tool_calls[0].id, /^toolu_/);
  assert.equal(typeof m.tool_calls[0].args.city, 'string');
  const answer = await chatModel().bindTools([weather]).invoke([
    ask, m, new ToolMessage({ tool_call_id: m.tool_calls[0].id, content: '{"celsius": 21}' }),
  ]);
  assert.equal(typeof answer.content, 'string');
  assert.equal(answer.tool_calls.length, 0);
});

await pass('bindTools with tool_choice any, streamed', async () => {
  let full = null;
  const bound = chatModel({ maxTokens: 128 }).bindTools([weather], { tool_choice: 'any' });
  for await (const chunk of await bound.stream('Weather in Rome?')) full = full ? full.concat(chunk) : chunk;
  assert.equal(full.tool_calls.length, 1);
  assert.equal(full.tool_calls[0].name, 'get_weather');
  assert.equal(typeof full.tool_calls[0].args.city, 'string');
});

await pass('withStructuredOutput (a forced tool call)', async () => {
  // Bounded (the random weights finish them) and ASCII: JSON Schema's maxLength counts
  // characters, zod's max UTF-16 units, so a character outside the BMP (which the random model
  // may write) would pass the grammar and fail zod.
  // (one schema each: a shared one is written as a $ref to the first property)
  const word = () => z.string().regex(/^[A-Za-z ]{1,12}$/);
  const out = await chatModel({ maxTokens: 128 })
    .withStructuredOutput(z.object({ city: word(), country: word() }), { name: 'place' })
    .invoke('A city and its country.');
  assert.equal(typeof out.city, 'string');
  assert.equal(typeof out.country, 'string');
});

await pass('thinking enabled: a thinking block', async () => {
  // ChatAnthropic refuses a temperature other than 1 with thinking.
  const m = await chatModel({ temperature: 1, maxTokens: 8, thinking: { type: 'enabled', budget_tokens: 1024 } })
    .invoke(messages);
  assert.ok(Array.isArray(m.content), 'content blocks');
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(typeof m.content[0].thinking, 'string');
});

await pass('server errors reach the caller', async () => {
  await assert.rejects(chatModel({ temperature: 5 }).invoke(messages),
    (err) => err.status === 400 && /temperature/.test(err.message));
});

finish('langchain-anthropic');
