// anthropic_sdk.mjs - a scripted session through Anthropic's official Node SDK against
// /v1/messages: messages.create, messages.stream with its text events and finalMessage(),
// a forced tool call (tool_choice {type: 'tool'}) round trip with tool_result, thinking
// blocks, stop reasons, countTokens, x-api-key auth and the SDK's typed errors.
//   usage: node anthropic_sdk.mjs
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { apiKey, baseURL, finish, modelId, pass } from './harness.mjs';

const { VERSION } = await import('@anthropic-ai/sdk/version');
const session = `@anthropic-ai/sdk@${VERSION}`;
// The SDK appends /v1/messages itself (it sends the key as x-api-key).
const client = new Anthropic({ baseURL: baseURL.replace(/\/v1\/?$/, ''), apiKey, maxRetries: 0, timeout: 60_000 });
const model = await modelId();

// ignore_eos (an inferd extension) everywhere: the synthetic test model may emit EOS at once.
const base = { model, max_tokens: 6, temperature: 0, ignore_eos: true, system: 'Be brief.' };
const messages = [{ role: 'user', content: 'Hi there' }];
let text = null;

await pass('messages.create', async () => {
  const m = await client.messages.create({ ...base, messages });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, model);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 6);
  assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  text = m.content[0].text;
});

await pass('messages.stream: text events and finalMessage()', async () => {
  const stream = client.messages.stream({ ...base, messages });
  let streamed = '';
  const kinds = [];
  stream.on('text', (delta) => { streamed += delta; });
  stream.on('streamEvent', (ev) => { kinds.push(ev.type); });
  const final = await stream.finalMessage();
  assert.equal(streamed, text);
  assert.equal(final.content[0].text, text);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 6);
  assert.equal(kinds[0], 'message_start');
  assert.equal(kinds.at(-1), 'message_stop');
  assert.ok(kinds.includes('content_block_delta') && kinds.includes('message_delta'));
});

await pass('stream: true iterated by hand', async () => {
  const events = await client.messages.create({ ...base, messages, stream: true });
  let streamed = '';
  for await (const ev of events) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') streamed += ev.delta.text;
  }
  assert.equal(streamed, text);
});

const weather = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] },
};

await pass('tool_use round trip: forced call -> tool_result -> answer', async () => {
  const ask = [{ role: 'user', content: 'Weather in Paris?' }];
  const first = await client.messages.create({
    ...base, max_tokens: 128, messages: ask, tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' },
  });
  assert.equal(first.stop_reason, 'tool_use');
  const use = first.content.find((b) => b.type === 'tool_use');
  assert.ok(use, 'a tool_use block');
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'get_weather');
  assert.equal(typeof use.input.city, 'string');
  const answer = await client.messages.create({
    ...base, max_tokens: 8, tools: [weather],
    messages: [...ask, { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '{"celsius": 21}' }] }],
  });
  assert.ok(['end_turn', 'max_tokens'].includes(answer.stop_reason));
  assert.equal(answer.content[0].type, 'text');
});

await pass('tool_use streamed: input_json_delta assembled by the SDK', async () => {
  const stream = client.messages.stream({
    ...base, max_tokens: 128, messages: [{ role: 'user', content: 'Weather in Rome?' }], tools: [weather],
    tool_choice: { type: 'any' },
  });
  let json = '';
  stream.on('inputJson', (partial) => { json += partial; });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const use = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(use.input, JSON.parse(json));
  assert.equal(typeof use.input.city, 'string');
});

await pass('thinking: enabled -> a thinking block (created and streamed)', async () => {
  const args = { ...base, max_tokens: 16, messages, thinking: { type: 'enabled', budget_tokens: 1024 } };
  const m = await client.messages.create(args);
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(typeof m.content[0].thinking, 'string');
  let thought = '';
  const stream = client.messages.stream(args);
  stream.on('thinking', (delta) => { thought += delta; });
  const final = await stream.finalMessage();
  assert.equal(final.content[0].type, 'thinking');
  assert.equal(thought, final.content[0].thinking);
  assert.equal(thought, m.content[0].thinking);
  // the thinking block sent back with the next turn is accepted
  const next = await client.messages.create({
    ...base, messages: [...messages, { role: 'assistant', content: m.content }, { role: 'user', content: 'Go on' }],
  });
  assert.equal(next.content[0].type, 'text');
});

await pass('messages.countTokens', async () => {
  const { max_tokens, temperature, ignore_eos, ...countArgs } = base;
  const c = await client.messages.countTokens({ ...countArgs, messages });
  const m = await client.messages.create({ ...base, messages });
  assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

await pass('errors are the SDK typed errors', async () => {
  await assert.rejects(
    client.messages.create({ ...base, messages, temperature: -1 }),
    (err) => err instanceof Anthropic.BadRequestError && err.status === 400 && err.error?.type === 'error' &&
      err.error.error.type === 'invalid_request_error' && /temperature/.test(err.error.error.message),
  );
  await assert.rejects(
    client.messages.create({ ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] }),
    (err) => err instanceof Anthropic.BadRequestError && /image/.test(err.error.error.message),
  );
  const bad = new Anthropic({ baseURL: client.baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ ...base, messages }),
    (err) => err instanceof Anthropic.AuthenticationError && err.status === 401 && err.error.error.type === 'authentication_error');
});

finish(session);
