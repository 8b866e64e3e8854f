// common.mjs - what the agent sessions share: the tools they offer, the schema of the final
// answer, and the logit bias that makes the model's free choice deterministic enough to test.
//
// The model is tiny and random (real Qwen2.5 vocabulary, random weights), so an agent's flow is
// steered through the server's own guarantees: a forced first call (tool_choice) is a call by
// grammar; afterwards tools + auto + the response format is "a call or the schema's answer" by
// grammar, and a bias toward '{' picks the answer (a call starts with '<tool_call>'), so the run
// ends with a structured final output instead of calling tools until maxTurns.
import { apiKey, baseURL } from '../harness.mjs';

export const root = baseURL.replace(/\/v1$/, '');

/** logit_bias favouring the first token of a JSON answer. */
export async function answerBias() {
  const bias = {};
  for (const content of ['{', '{"']) {
    const r = await fetch(`${root}/tokenize`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
      body: JSON.stringify({ content }),
    });
    const j = await r.json();
    if (j.tokens.length === 1) bias[String(j.tokens[0])] = 30;
  }
  return bias;
}

/** What the tools were called with, in order (each session checks its round trip). */
export const toolLog = [];

export const weatherArgs = { city: 'string (at most 12 characters)' };
