// langchain.mjs - a scripted session through LangChain JS: ChatOpenAI (`@langchain/openai`) with
// a baseURL: invoke, stream (with usage), batch, bindTools, withStructuredOutput, and the same
// model with useResponsesApi (/v1/responses).
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, SystemMessage } from '@langchain/core/messages';
import { z } from 'zod';
import { ISSUE, apiKey, baseURL, finish, modelId, pass, xfail } from './harness.mjs';

const MODEL = await modelId();
const chatModel = (extra = {}) => new ChatOpenAI({
  model: MODEL,
  apiKey,
  configuration: { baseURL },
  temperature: 0,
  maxTokens: 5,
  maxRetries: 0,
  streamUsage: true, // stream_options.include_usage
  // ignore_eos (an inferd extension): the synthetic test model may emit EOS at once.
  modelKwargs: { ignore_eos: true },
  ...extra,
});
const llm = chatModel();
const messages = [new SystemMessage('Be brief.'), new HumanMessage('Hi there')];
let text = null;

await pass('invoke', async () => {
  const m = await llm.invoke(messages);
  assert.equal(typeof m.content, 'string');
  assert.equal(m.response_metadata.finish_reason, 'length');
  assert.equal(m.usage_metadata.output_tokens, 5);
  text = m.content;
});

await pass('stream (chunks concatenate, usage at the end)', async () => {
  let full = null;
  for await (const chunk of await llm.stream(messages)) full = full ? full.concat(chunk) : chunk;
  assert.equal(full.content, text);
  assert.equal(full.usage_metadata?.output_tokens, 5);
});

await pass('batch', async () => {
  const rs = await llm.batch([messages, [new HumanMessage('Another one')]]);
  assert.equal(rs.length, 2);
  assert.equal(rs[0].content, text);
});

await pass('server errors reach the caller', async () => {
  await assert.rejects(chatModel({ temperature: 5 }).invoke(messages), (err) => err.status === 400);
});

await pass('bindTools: a tool call', async () => {
  // The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
  // JSON Schema's maxLength (what the grammar enforces) counts characters.
  const weather = { name: 'get_weather', description: 'The weather in a city', schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) };
  const m = await chatModel({ maxTokens: 128 }).bindTools([weather], { tool_choice: 'get_weather' })
    .invoke('What is the weather in Paris?');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].name, 'get_weather');
  assert.equal(typeof m.tool_calls[0].args.city, 'string');
});

await pass('withStructuredOutput (json_schema)', async () => {
  const r = await chatModel({ maxTokens: 128 })
    .withStructuredOutput(z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }), { name: 'city', method: 'jsonSchema' })
    .invoke('A city, as JSON.');
  assert.equal(typeof r.city, 'string');
});

// useResponsesApi: the same model over /v1/responses (modelKwargs reach its body too).
await pass('useResponsesApi: invoke and stream equal the chat-completions reply', async () => {
  const rllm = chatModel({ useResponsesApi: true });
  const m = await rllm.invoke(messages);
  assert.equal(m.text, text);
  assert.equal(m.usage_metadata.output_tokens, 5);
  let full = null;
  for await (const chunk of await rllm.stream(messages)) full = full ? full.concat(chunk) : chunk;
  assert.equal(full.text, text);
});

await pass('useResponsesApi: bindTools', async () => {
  const weather = { name: 'get_weather', description: 'The weather in a city', schema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) };
  const m = await chatModel({ maxTokens: 128, useResponsesApi: true }).bindTools([weather], { tool_choice: 'get_weather' })
    .invoke('What is the weather in Paris?');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].name, 'get_weather');
});

finish('langchain');
