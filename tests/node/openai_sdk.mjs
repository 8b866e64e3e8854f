// openai_sdk.mjs - a scripted session through the official OpenAI Node SDK: models, completions,
// chat, streaming through the SDK's own stream helpers (with include_usage), logprobs, n, typed
// errors, tools, response_format, reasoning content, and the Responses API (create, stream,
// function calls, parse).
//   usage: node openai_sdk.mjs [PACKAGE]   PACKAGE: 'openai' (the current major, default) or an
//          npm alias of another major in package.json ('openai-v5', the oldest one promised)
import assert from 'node:assert/strict';
import { z } from 'zod';
import { ISSUE, apiKey, baseURL, finish, pass, xfail } from './harness.mjs';

const pkg = process.argv[2] ?? 'openai';
const { default: OpenAI } = await import(pkg);
const { zodResponseFormat, zodFunction, zodTextFormat, zodResponsesFunction } = await import(`${pkg}/helpers/zod`);
const session = `${pkg}@${(await import(`${pkg}/version`)).VERSION}`;

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;

// ignore_eos (an inferd extension) everywhere: the synthetic test model may emit EOS at once.
const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }];
const chatArgs = { model, messages, max_tokens: 5, temperature: 0, ignore_eos: true };
let chatText = null;
let completionText = null;

await pass('completions', async () => {
  const c = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices.length, 1);
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.equal(typeof c.choices[0].text, 'string');
  assert.equal(c.usage.completion_tokens, 6);
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + 6);
  completionText = c.choices[0].text;
});

await pass('chat', async () => {
  const chat = await client.chat.completions.create(chatArgs);
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(typeof chat.choices[0].message.content, 'string');
  assert.equal(chat.usage.completion_tokens, 5);
  chatText = chat.choices[0].message.content;
});

await pass('chat stream helper + include_usage', async () => {
  // chat.completions.stream: the SDK assembles the deltas (content events, the final message).
  const stream = client.chat.completions.stream({ ...chatArgs, stream_options: { include_usage: true } });
  let text = '';
  let chunks = 0;
  stream.on('content', (delta) => { text += delta; });
  stream.on('chunk', () => { chunks++; });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].message.role, 'assistant');
  assert.equal(final.choices[0].finish_reason, 'length');
  assert.equal(final.choices[0].message.content, chatText);
  assert.equal(text, chatText);
  assert.ok(final.usage, 'include_usage sends a usage chunk');
  assert.equal(final.usage.completion_tokens, 5);
  assert.equal((await stream.totalUsage()).completion_tokens, 5);
  assert.ok(chunks >= 3);
});

await pass('completions stream', async () => {
  // completions have no assembling helper: the SDK's Stream is iterated (it parses the SSE).
  const cs = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const chunk of cs) {
    for (const ch of chunk.choices) text += ch.text;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, completionText);
  assert.equal(usage?.completion_tokens, 6);
});

await pass('chat logprobs + top_logprobs (stream helper too)', async () => {
  const r = await client.chat.completions.create({ ...chatArgs, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.top_logprobs[0].logprob >= t.logprob - 1e-4, 'greedy: the sampled token is the top one');
  }
  const stream = client.chat.completions.stream({ ...chatArgs, logprobs: true, top_logprobs: 3 });
  let streamed = [];
  stream.on('logprobs.content.done', (e) => { streamed = e.content; });
  await stream.finalChatCompletion();
  assert.deepEqual(streamed.map((t) => t.token), lp.map((t) => t.token));
});

await pass('completions logprobs', async () => {
  const c = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs.length, 4);
  assert.equal(lp.top_logprobs.length, 4);
  assert.equal(lp.tokens.join(''), c.choices[0].text);
});

await pass('n = 3 choices (and streamed, one snapshot per choice)', async () => {
  const r = await client.chat.completions.create({ ...chatArgs, n: 3, temperature: 1, seed: 7 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 15);
  const stream = client.chat.completions.stream({ ...chatArgs, n: 3, temperature: 1, seed: 7 });
  const final = await stream.finalChatCompletion();
  assert.deepEqual(final.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
});

await pass('errors are the SDK typed errors', async () => {
  await assert.rejects(
    client.completions.create({ model, prompt: 'x', temperature: -1 }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && err.param === 'temperature',
  );
  const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (err) => err instanceof OpenAI.AuthenticationError && err.status === 401);
});

// Strings are bounded so that a random-weight model, forced by the grammar, finishes them.
// The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
// JSON Schema's maxLength (what the grammar enforces) counts characters.
const weather = zodFunction({ name: 'get_weather', parameters: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) });

await pass('tools: a forced call, assembled by the stream helper', async () => {
  // The arguments stream as the model writes them, not held back for one fragment (issue 33).
  // Fragments go out per take of the server's output, and on a loaded machine one take can
  // hold them all: so up to 6 streams, until one comes in more than one fragment.
  let fragments = 0;
  for (let attempt = 0; attempt < 6 && fragments < 2; attempt++) {
    const stream = client.chat.completions.stream({
      ...chatArgs, max_tokens: 128, messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    let done = null;
    fragments = 0;
    stream.on('tool_calls.function.arguments.delta', () => { fragments++; });
    stream.on('tool_calls.function.arguments.done', (e) => { done = e; });
    const final = await stream.finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(done?.name, 'get_weather');
    assert.equal(typeof done.parsed_arguments.city, 'string');
  }
  assert.ok(fragments > 1, `the arguments came in ${fragments} fragment(s), 6 times`);
});

await pass('tools round trip: forced call -> tool message -> answer', async () => {
  const ask = [{ role: 'user', content: 'Weather in Paris?' }];
  const first = await client.chat.completions.create({
    ...chatArgs, max_tokens: 128, messages: ask, tools: [weather], tool_choice: 'required',
  });
  const call = first.choices[0].message.tool_calls?.[0];
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  assert.equal(first.choices[0].message.content, null);
  assert.equal(call?.function.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
  const answer = await client.chat.completions.create({
    ...chatArgs, max_tokens: 8, tools: [weather],
    messages: [...ask, first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '{"celsius": 21}' }],
  });
  assert.equal(typeof answer.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(answer.choices[0].finish_reason));
});

await pass('response_format json_schema: chat.completions.parse', async () => {
  const r = await client.chat.completions.parse({
    ...chatArgs, max_tokens: 128, messages: [{ role: 'user', content: 'A city, as JSON.' }],
    response_format: zodResponseFormat(z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }), 'city'),
  });
  assert.equal(typeof r.choices[0].message.parsed?.city, 'string');
});

await pass('reasoning_content in the message (the template opens <think>)', async () => {
  const r = await client.chat.completions.create({ ...chatArgs, max_tokens: 16, chat_template_kwargs: { enable_thinking: true } });
  assert.equal(typeof r.choices[0].message.reasoning_content, 'string');
});

// The Responses API (/v1/responses): translated to the chat machinery, so its text equals the
// chat reply to the same messages; streamed as the typed events the SDK accumulates itself.
const respArgs = { model, instructions: 'Be brief.', input: 'Hi there', max_output_tokens: 5, temperature: 0, ignore_eos: true };

await pass('responses.create: output_text equals the chat reply', async () => {
  const r = await client.responses.create(respArgs);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details?.reason, 'max_output_tokens');
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output_text, chatText);
  assert.equal(r.usage.output_tokens, 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 5);
});

await pass('responses.stream: events assembled by the SDK', async () => {
  const stream = client.responses.stream(respArgs);
  let text = '';
  const types = [];
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  stream.on('event', (e) => { types.push(e.type); });
  const final = await stream.finalResponse();
  // (openai 5.x does not set output_text on a streamed response: read the message itself)
  const message = final.output.filter((o) => o.type === 'message').flatMap((o) => o.content);
  assert.equal(message.map((c) => c.text).join(''), chatText);
  assert.equal(text, chatText);
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.incomplete');
  assert.ok(types.includes('response.output_item.added') && types.includes('response.content_part.done'));
});

await pass('responses: a forced function call, then its output as input', async () => {
  const tool = zodResponsesFunction({ name: 'get_weather', parameters: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }) });
  const input = [{ role: 'user', content: 'Weather in Paris?' }];
  const first = await client.responses.create({ ...respArgs, max_output_tokens: 128, input, tools: [tool], tool_choice: 'required' });
  const call = first.output.find((o) => o.type === 'function_call');
  assert.equal(call?.name, 'get_weather');
  assert.equal(typeof JSON.parse(call.arguments).city, 'string');
  const streamed = client.responses.stream({ ...respArgs, max_output_tokens: 128, input, tools: [tool], tool_choice: { type: 'function', name: 'get_weather' } });
  let argsDone = null;
  streamed.on('response.function_call_arguments.done', (e) => { argsDone = e.arguments; });
  const sf = await streamed.finalResponse();
  assert.equal(sf.output.find((o) => o.type === 'function_call')?.arguments, argsDone);
  const answer = await client.responses.create({
    ...respArgs, max_output_tokens: 8, tools: [tool],
    input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: '{"celsius": 21}' }],
  });
  assert.equal(typeof answer.output_text, 'string');
});

await pass('responses.parse: text.format json_schema', async () => {
  const r = await client.responses.parse({
    ...respArgs, max_output_tokens: 128, input: 'A city, as JSON.',
    text: { format: zodTextFormat(z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }), 'city') },
  });
  assert.equal(typeof r.output_parsed?.city, 'string');
});

await pass('responses: reasoning as a reasoning item (created and streamed)', async () => {
  const args = { ...respArgs, max_output_tokens: 16, chat_template_kwargs: { enable_thinking: true } };
  const r = await client.responses.create(args);
  assert.equal(r.output[0].type, 'reasoning');
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  const final = await client.responses.stream(args).finalResponse();
  assert.deepEqual(final.output.map((o) => o.type), r.output.map((o) => o.type));
  assert.equal(final.output[0].content[0].text, r.output[0].content[0].text);
});

await pass('responses: stored state is refused by name', async () => {
  await assert.rejects(
    client.responses.create({ ...respArgs, previous_response_id: 'resp_123' }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'previous_response_id',
  );
});

finish(session);
