// ai_sdk_tools.mjs - the Vercel AI SDK tool-call case the provider sessions share: one `weather`
// tool, and a two-step generateText whose first step must call it (toolChoice required), whose
// tool runs, and whose second step answers with the result sent back (toolChoice none).
import assert from 'node:assert/strict';
import { generateText, stepCountIs, tool } from 'ai';
import { z } from 'zod';

/** The weather tool; run: whether the SDK executes it (a result of 21 degrees). */
export function weatherTool(run = true) {
  return tool({
    description: 'The weather in a city',
    // The model's strings are bounded by an ASCII pattern, not .max(): zod counts UTF-16 units where
    // JSON Schema's maxLength (what the grammar enforces) counts characters.
    inputSchema: z.object({ city: z.string().regex(/^[A-Za-z ]{1,12}$/) }),
    ...(run && { execute: async ({ city }) => ({ city, celsius: 21 }) }),
  });
}

/** Both steps through the provider of common.model; returns the first step's call. */
export async function twoStepToolCall(common) {
  const r = await generateText({
    ...common, maxOutputTokens: 128, prompt: 'What is the weather in Paris?', toolChoice: 'required',
    stopWhen: stepCountIs(2),
    prepareStep: ({ stepNumber }) => (stepNumber > 0 ? { toolChoice: 'none', maxOutputTokens: 8 } : {}),
    tools: { weather: weatherTool() },
  });
  assert.equal(r.steps.length, 2);
  const [first] = r.steps;
  assert.equal(first.finishReason, 'tool-calls');
  assert.equal(first.toolCalls.length, 1);
  assert.equal(first.toolCalls[0].toolName, 'weather');
  assert.equal(typeof first.toolCalls[0].input.city, 'string');
  assert.equal(first.toolResults[0].output.celsius, 21);
  assert.equal(r.steps[1].toolCalls.length, 0);
  assert.equal(typeof r.text, 'string');
  return first.toolCalls[0];
}
