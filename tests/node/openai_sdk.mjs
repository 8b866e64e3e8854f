// openai_sdk.mjs - inferd through the official OpenAI Node SDK: completions, chat, streaming
// (chat and completions) and stream_options.include_usage.  Started by
// tests/server/http_integration.py node with INFERD_BASE_URL / INFERD_API_KEY set.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.INFERD_BASE_URL,
  apiKey: process.env.INFERD_API_KEY ?? 'unused',
  maxRetries: 0,
  timeout: 60_000,
});

const models = await client.models.list();
const model = models.data[0].id;
assert.equal(models.data.length, 1);

// completions
const c = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true });
assert.equal(c.object, 'text_completion');
assert.equal(c.choices.length, 1);
assert.equal(c.choices[0].finish_reason, 'length');
assert.equal(typeof c.choices[0].text, 'string');
assert.equal(c.usage.completion_tokens, 6);
assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 6);

// chat
const chat = await client.chat.completions.create({
  model,
  messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }],
  max_tokens: 5,
  temperature: 0,
  ignore_eos: true, // an inferd extension: the synthetic test model may emit EOS at once
});
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.equal(chat.usage.completion_tokens, 5);

// chat streaming with include_usage: same text as the non-streamed request
const stream = await client.chat.completions.create({
  model,
  messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }],
  max_tokens: 5,
  temperature: 0,
  ignore_eos: true,
  stream: true,
  stream_options: { include_usage: true },
});
let text = '';
let role = null;
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  assert.equal(chunk.object, 'chat.completion.chunk');
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    if (ch.delta.role) role = ch.delta.role;
    text += ch.delta.content ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(role, 'assistant');
assert.equal(finish, 'length');
assert.equal(text, chat.choices[0].message.content);
assert.ok(usage, 'include_usage sends a usage chunk');
assert.equal(usage.completion_tokens, 5);
assert.ok(chunks >= 3);

// completions streaming
const cs = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true, stream: true });
let ctext = '';
for await (const chunk of cs) for (const ch of chunk.choices) ctext += ch.text;
assert.equal(ctext, c.choices[0].text);

// errors arrive as the SDK's typed errors
await assert.rejects(
  client.completions.create({ model, prompt: 'x', temperature: -1 }),
  (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.param === 'temperature',
);

console.log(`openai sdk: ok (model ${model}, chat text ${JSON.stringify(text)})`);
