// instructor.mjs - Instructor JS in its JSON_SCHEMA mode, which sends response_format
// {"type": "json_object", "schema": ...} (llama-server's form; issue 33: the schema was
// ignored), whole and streamed as partial objects.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Instructor from '@instructor-ai/instructor';
import { z } from 'zod/v3';
import { apiKey, baseURL, finish, modelId, pass } from '../harness.mjs';

const model = await modelId();
const client = Instructor({ client: new OpenAI({ baseURL, apiKey, maxRetries: 0 }), mode: 'JSON_SCHEMA' });
// The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
// JSON Schema's maxLength (what the grammar enforces) counts characters.
const User = z.object({ name: z.string().regex(/^[A-Za-z ]{1,10}$/), age: z.number().int().min(0).max(120) });
const messages = [{ role: 'user', content: 'Jason is 30 years old. Extract the user.' }];

await pass('JSON_SCHEMA: a validated object', async () => {
  for (const seed of [1, 2, 3]) {
    const u = await client.chat.completions.create({
      model, messages, max_tokens: 60, seed, temperature: 1, max_retries: 0,
      response_model: { schema: User, name: 'User' },
    });
    assert.equal(typeof u.name, 'string');
    assert.ok(Number.isInteger(u.age) && u.age >= 0 && u.age <= 120, `age ${u.age}`);
  }
});

await pass('JSON_SCHEMA: streamed partial objects end in a valid one', async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 60, seed: 4, temperature: 1, stream: true,
    response_model: { schema: User, name: 'User' },
  });
  let last;
  for await (const partial of stream) last = partial;
  User.parse({ name: last.name, age: last.age });
});

finish(`instructor (${process.env.INFERD_TEMPLATE ?? ''})`);
