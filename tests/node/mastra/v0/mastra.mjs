// mastra.mjs - the Mastra session (../session.mjs) on Mastra 0.x, the newest that runs on
// Debian 12's Node 18 (1.x uses the global crypto, which Node 18 lacks).
import { z } from 'zod';
import { Agent } from '@mastra/core/agent';
import { createTool } from '@mastra/core/tools';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { mastraSession } from '../session.mjs';

await mastraSession({
  Agent, createTool, createOpenAICompatible, z, version: '0.x',
  toolInput: (arg) => arg.context, // 0.x: execute({ context: input, runtimeContext, ... })
});
