#!/usr/bin/env python3
"""run.py - the tokenizer test over published vocabularies that npm packages carry (Tekken,
DeepSeek V3, Gemma 3; tests/text/vocab/vocabs.json): makes each one's vocab GGUF from the installed
package's tokenizer.json with vocab_gguf.py (kept in the build folder, remade when the package
or the script changes), then runs test_tokenizer --npm-vocab against the reference ids in
npm-vocab-ids.json.

    run.py TEST_TOKENIZER_BINARY

Exits 77 (skipped, with the reason) when the packages are not installed: they come with
tests/node's `npm ci`, which scripts/test runs unless INFERD_NO_NPM=1."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
root = Path(os.environ.get('INFERD_SOURCE_DIR', here.parent.parent.parent))
build = Path(os.environ.get('INFERD_BUILD_DIR', root / 'build'))
modules = root / 'tests' / 'node' / 'node_modules'
ids_path = here / 'npm-vocab-ids.json'


def skip(why):
    print(f'SKIPPED: {why}')
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    vocabs = json.loads((here / 'vocabs.json').read_text())['vocabs']
    sources = json.loads(ids_path.read_text())['sources']
    out = build / 'npm-vocab'
    out.mkdir(parents=True, exist_ok=True)
    for v in vocabs:
        pkg = modules / v['package']
        tok_json = pkg / 'models' / 'tokenizer.json'
        if not tok_json.is_file():
            skip(f"{v['package']} is not installed under {modules} (it comes with `npm ci` in tests/node; "
                 'scripts/test runs that unless INFERD_NO_NPM=1)')
        src = sources.get(v['name'])
        digest = hashlib.sha256(tok_json.read_bytes()).hexdigest()
        if not src or src['sha256'] != digest:
            sys.exit(f"{tok_json} (sha256 {digest}) is not the tokenizer.json {ids_path.name}'s ids for "
                     f"{v['name']} were made from ({src and src['sha256']}): rerun tests/text/vocab/make_vectors.mjs")
        gguf = out / f"ggml-vocab-{v['name']}.gguf"
        inputs = [tok_json, pkg / 'models' / 'tokenizer_config.json', here / 'vocab_gguf.py']
        if not gguf.is_file() or gguf.stat().st_mtime < max(p.stat().st_mtime for p in inputs):
            subprocess.run([sys.executable, str(here / 'vocab_gguf.py'), v['kind'], str(pkg), str(gguf)], check=True)
    sys.stdout.flush()
    os.execv(sys.argv[1], [sys.argv[1], '--npm-vocab', str(out), str(ids_path)])


if __name__ == '__main__':
    main()
