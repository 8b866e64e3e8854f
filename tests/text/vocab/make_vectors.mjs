// make_vectors.mjs - reference ids for the published vocabularies that npm packages carry
// (Mistral Nemo's Tekken, DeepSeek V3's, Gemma 3's), from their tokenizer.json through Hugging Face's
// tokenizers.js (@huggingface/tokenizers, the tokenizers of transformers.js), over the shared
// texts: ../shared/vocab/hf-texts.json, llama.cpp's .inp test texts and the few
// vocabulary-specific ones below.  Writes tests/text/vocab/npm-vocab-ids.json, which the
// tokenizer test reads; run again (node tests/text/vocab/make_vectors.mjs from the repository
// root, after `npm ci` in tests/node) when a package version in tests/node/package.json changes.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..', '..');
const shared = process.env.INFERD_SHARED_DIR || join(root, '..', 'shared');
const nodeDir = join(root, 'tests', 'node');
const require = createRequire(join(nodeDir, 'package.json'));
const pkgDir = (name) => join(nodeDir, 'node_modules', name);
const pkgVersion = (name) => JSON.parse(readFileSync(join(pkgDir(name), 'package.json'), 'utf8')).version;
const { Tokenizer } = require('@huggingface/tokenizers');
const VOCABS = JSON.parse(readFileSync(join(here, 'vocabs.json'), 'utf8')).vocabs;

function llamaCppTexts(path) {
    const parts = readFileSync(path, 'utf8').split('\n__ggml_vocab_test__\n');
    return parts.slice(0, -1); // the file ends with a separator
}

const texts = [];
const seen = new Set();
const add = (t) => { if (!seen.has(t)) { seen.add(t); texts.push(t); } };
JSON.parse(readFileSync(join(shared, 'vocab', 'hf-texts.json'), 'utf8')).texts.forEach(add);
llamaCppTexts(join(shared, 'vocab', 'ggml-vocab-qwen35.gguf.inp')).forEach(add);
[
    // Tekken: its control tokens written in text, a chat turn, tool calls
    '<s>[INST] What is 2+2? [/INST] 4</s>[INST] And 3+3? [/INST]',
    '[AVAILABLE_TOOLS] [{"type": "function"}][/AVAILABLE_TOOLS][TOOL_CALLS] [{"name": "f", "arguments": {}}]',
    // Gemma: its turn markers, an unused slot, runs of whitespace longer than its longest token
    '<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n',
    '<bos><unused0> [multimodal] <mask>',
    ' '.repeat(40) + 'x' + '\t'.repeat(40) + 'y' + '\n'.repeat(40) + 'z',
    'a \n b  \n\n c   \n\n\n d\r\n\r\ne',
    'ＦＵＬＬＷＩＤＴＨ ｆｕｌｌ ５６ ﬁ ℌ ㎏ ½ ﹏',
    '\u0001\u001f\u007f \u200b\u200d\ufeff\ufffd end',
].forEach(add);

const out = {
    about: 'Reference ids from @huggingface/tokenizers (tokenizers.js) for tokenizer.json files published in npm packages; made by tests/text/vocab/make_vectors.mjs. ids = encode(text, {add_special_tokens: false}) (added tokens written in the text ARE parsed); ids_add_special = encode(text) (what the tokenizer adds by default).',
    reference: `@huggingface/tokenizers ${pkgVersion('@huggingface/tokenizers')}`,
    sources: {},
    texts,
    expected: {},
};
for (const v of VOCABS) {
    const dir = pkgDir(v.package);
    const jsonText = readFileSync(join(dir, 'models', 'tokenizer.json'));
    const cfg = JSON.parse(readFileSync(join(dir, 'models', 'tokenizer_config.json'), 'utf8'));
    const tok = new Tokenizer(JSON.parse(jsonText), cfg);
    // transformers' LlamaTokenizerFast (DeepSeek V3's class) rewrites the post-processor to put
    // BOS first when tokenizer_config.json says add_bos_token; tokenizers.js keeps tokenizer.json's
    // (DeepSeek V3's adds nothing), so BOS is put first here as transformers would.
    const bos = typeof cfg.bos_token === 'object' && cfg.bos_token ? cfg.bos_token.content : cfg.bos_token;
    const bosId = cfg.add_bos_token === true && typeof bos === 'string' ? tok.token_to_id(bos) : undefined;
    const addBos = bosId !== undefined && tok.encode('x').ids[0] !== bosId;
    const encodeAddSpecial = (t) => (addBos ? [bosId, ...tok.encode(t).ids] : tok.encode(t).ids);
    out.sources[v.name] = {
        package: v.package,
        version: pkgVersion(v.package),
        file: 'models/tokenizer.json',
        sha256: createHash('sha256').update(jsonText).digest('hex'),
        what: v.what,
    };
    const ids = [], idsAdd = [];
    let roundTrip = 0;
    for (const t of texts) {
        const a = tok.encode(t, { add_special_tokens: false }).ids;
        ids.push(a);
        idsAdd.push(encodeAddSpecial(t));
        roundTrip += (a.length ? tok.decode(a) : '') === t;
    }
    out.expected[v.name] = { ids, ids_add_special: idsAdd };
    console.log(`${v.name}: ${texts.length} texts, ${roundTrip} decode back to themselves`);
}
// One line per array keeps the file small and its diffs readable.
const json = JSON.stringify(out, null, 1).replace(/\[\s+([-\d,\s]*?)\s+\]/g, (m, ids) => `[${ids.replace(/\s+/g, '')}]`);
writeFileSync(join(here, 'npm-vocab-ids.json'), json + '\n');
