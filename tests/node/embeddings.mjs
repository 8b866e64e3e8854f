// embeddings.mjs - /v1/embeddings through the clients RAG pipelines point at a local server
// (issue 29): the OpenAI Node SDK's embeddings.create (float, and base64: the SDK's default,
// which it decodes), the Vercel AI SDK's embed / embedMany (its OpenAI-compatible provider) and
// LangChain's OpenAIEmbeddings (embedQuery / embedDocuments).  The same text gives the same unit
// vector through every client.  The server runs with --pooling last.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { embed, embedMany } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { OpenAIEmbeddings } from '@langchain/openai';
import { apiKey, baseURL, finish, modelId, pass } from './harness.mjs';

const MODEL = await modelId();
const texts = ['hello world', 'fn main', 'the scheduler packs prompts'];
let ref = null; // the vectors of texts as embeddings.create returned them (float)

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
function close(got, want, what) {
  assert.equal(got.length, want.length, `${what}: width`);
  for (let i = 0; i < got.length; i++) assert.ok(Math.abs(got[i] - want[i]) < 1e-6, `${what}: [${i}] ${got[i]} vs ${want[i]}`);
}

const client = new OpenAI({ apiKey, baseURL, maxRetries: 0 });

await pass('openai embeddings.create (float)', async () => {
  const r = await client.embeddings.create({ model: MODEL, input: texts, encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, texts.length);
  r.data.forEach((d, i) => {
    assert.equal(d.index, i);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, `norm ${norm(d.embedding)}`);
  });
  assert.ok(r.usage.prompt_tokens > 0);
  ref = r.data.map((d) => d.embedding);
});

await pass('openai embeddings.create (base64, the SDK default)', async () => {
  const r = await client.embeddings.create({ model: MODEL, input: texts });
  r.data.forEach((d, i) => close(d.embedding, ref[i], `input ${i}`));
});

await pass('openai embeddings.create with dimensions', async () => {
  const r = await client.embeddings.create({ model: MODEL, input: texts[0], dimensions: 8, encoding_format: 'float' });
  assert.equal(r.data[0].embedding.length, 8);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
});

await pass('the same server still chats (a text model given --pooling)', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
  assert.ok(r.usage.completion_tokens >= 1);
});

const provider = createOpenAICompatible({ name: 'inferd', baseURL, apiKey });
const embeddingModel = (provider.embeddingModel ?? provider.textEmbeddingModel).call(provider, MODEL);

await pass('ai embed', async () => {
  const r = await embed({ model: embeddingModel, value: texts[0], maxRetries: 0 });
  close(r.embedding, ref[0], 'embed');
  assert.ok(r.usage.tokens > 0);
});

await pass('ai embedMany', async () => {
  const r = await embedMany({ model: embeddingModel, values: texts, maxRetries: 0 });
  assert.equal(r.embeddings.length, texts.length);
  r.embeddings.forEach((e, i) => close(e, ref[i], `embedMany ${i}`));
});

const lc = new OpenAIEmbeddings({ model: MODEL, apiKey, configuration: { baseURL }, maxRetries: 0 });

await pass('langchain OpenAIEmbeddings.embedQuery', async () => {
  close(await lc.embedQuery(texts[1]), ref[1], 'embedQuery');
});

await pass('langchain OpenAIEmbeddings.embedDocuments', async () => {
  const vs = await lc.embedDocuments(texts);
  assert.equal(vs.length, texts.length);
  vs.forEach((v, i) => close(v, ref[i], `embedDocuments ${i}`));
});

finish('embeddings');
