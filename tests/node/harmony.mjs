// harmony.mjs - the OpenAI Node SDK against a gpt-oss model (the Harmony format, issue 25):
// ../shared/reference's tiny gpt-oss file with gpt-oss's published chat template, started by
// tests/server/http_integration.py (case node_harmony).  Its random weights never write Harmony
// markup by themselves, so the replies are forced: a GBNF grammar (an inferd extension) for an
// analysis message then the final one, tool_choice for a call (the server's grammar writes it
// in Harmony's call markup).  What the SDK must see: reasoning_content and content apart, tool
// calls its helpers assemble (chat and Responses, whole and streamed), the tool round trip.
//   usage: node harmony.mjs
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { z } from 'zod';
import { zodFunction, zodResponsesFunction } from 'openai/helpers/zod';
import { apiKey, baseURL, finish, pass } from './harness.mjs';

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const model = (await client.models.list()).data[0].id;
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
// plain-text spellings of the markers: a grammar never allows control tokens, and the text the
// server parses is the same
const grammar = 'root ::= "<|channel|>analysis<|message|>" [a-z]{3,8} '
  + '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{3,8}';
const word = /^[a-z]{3,8}$/;
const args = { model, messages: ask, max_tokens: 160, temperature: 0, grammar };
// The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
// JSON Schema's maxLength (what the grammar enforces) counts characters.
const weather = zodFunction({ name: 'get_weather', parameters: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) });

await pass('chat: analysis as reasoning_content, final as content', async () => {
  const r = await client.chat.completions.create(args);
  const m = r.choices[0].message;
  assert.match(m.reasoning_content, word);
  assert.match(m.content, word);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await pass('chat stream: the same, no markup in any delta', async () => {
  const stream = await client.chat.completions.create({ ...args, stream: true });
  let content = '', reasoning = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    for (const v of [d.content, d.reasoning_content]) assert.ok(!v?.includes('<|'), `markup in ${JSON.stringify(d)}`);
    content += d.content ?? '';
    reasoning += d.reasoning_content ?? '';
  }
  assert.match(content, word);
  assert.match(reasoning, word);
});

let call = null;
await pass('tools: a forced call in Harmony markup, read back as tool_calls', async () => {
  const r = await client.chat.completions.create({ ...args, grammar: undefined, max_tokens: 200, tools: [weather], tool_choice: 'required' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.content, null);
  call = r.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
});

await pass('tools: the stream helper assembles the call', async () => {
  const stream = client.chat.completions.stream({
    ...args, grammar: undefined, max_tokens: 200, tools: [weather],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  let done = null;
  stream.on('tool_calls.function.arguments.done', (e) => { done = e; });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(done?.name, 'get_weather');
  assert.equal(typeof done.parsed_arguments.city, 'string');
});

await pass('tools round trip: the call and its result re-rendered by the template', async () => {
  assert.ok(call, 'no call from the earlier case');
  const r = await client.chat.completions.create({
    ...args, tools: [weather],
    messages: [...ask, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"celsius": 21}' }],
  });
  assert.match(r.choices[0].message.content, word);
});

await pass('responses: a reasoning item, then the message', async () => {
  const r = await client.responses.create({ model, input: ask[0].content, max_output_tokens: 160, temperature: 0, grammar });
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.match(r.output_text, word);
});

await pass('responses: a forced function call, streamed', async () => {
  const tool = zodResponsesFunction({ name: 'get_weather', parameters: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) });
  const stream = client.responses.stream({
    model, input: ask[0].content, max_output_tokens: 200, temperature: 0, tools: [tool], tool_choice: 'required',
  });
  let argsDone = null;
  stream.on('response.function_call_arguments.done', (e) => { argsDone = e.arguments; });
  const final = await stream.finalResponse();
  const fc = final.output.find((o) => o.type === 'function_call');
  assert.equal(fc?.name, 'get_weather');
  assert.equal(fc.arguments, argsDone);
  assert.equal(typeof JSON.parse(fc.arguments).city, 'string');
});

finish('harmony');
