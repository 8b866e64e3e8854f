// mastra.mjs - the Mastra session (../session.mjs) on Mastra 1.x (Node >= 22.13; run with
// the Node 22 this project installs where the system's is older).
import { z } from 'zod';
import { Agent } from '@mastra/core/agent';
import { createTool } from '@mastra/core/tools';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { mastraSession } from '../session.mjs';

await mastraSession({
  Agent, createTool, createOpenAICompatible, z, version: '1.x',
  toolInput: (arg) => arg, // 1.x: execute(input, context)
});
