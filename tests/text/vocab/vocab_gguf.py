#!/usr/bin/env python3
"""vocab_gguf.py - a vocab-only GGUF (tokenizer.ggml.* keys, no tensors) from a published
tokenizer.json + tokenizer_config.json, with the keys and values llama.cpp's converter writes
for that kind of tokenizer (convert_hf_to_gguf.py / gguf-py, read from ../shared/peers: the
converter itself needs torch and transformers, which this machine cannot install).

    vocab_gguf.py KIND PACKAGE_DIR OUT.gguf

KIND tekken: byte-level BPE as TextModel._set_vocab_gpt2 writes it: tokenizer.ggml.model
  "gpt2", pre "tekken" (what get_vocab_base_pre's hash names for Mistral Nemo's tokenizer),
  every id's text (added tokens included), types from get_vocab_base (special added tokens
  CONTROL, other added USER_DEFINED, the rest NORMAL), and SpecialVocab's merges, special ids,
  add_bos/add_eos and chat template.
KIND deepseek-v3: the same, with pre "deepseek-v3" (DeepseekV2Model.set_vocab is
  _set_vocab_gpt2; DeepSeek V3's hash is named "deepseek-v3") and architecture deepseek2.
KIND gemma: SentencePiece-style BPE (U+2581 for spaces, byte fallback) as
  Gemma4Model.set_vocab writes it: tokenizer.ggml.model "gemma4", LlamaHfVocab's tokens and
  scores (-1000), SpecialVocab's merges and ids, add_space_prefix false, add_bos true.  Token
  types (and user-defined tokens' texts) are those of the published Gemma 3 GGUFs, which the
  converter makes from tokenizer.model and tokenizer_config.json's added_tokens_decoder
  (_create_vocab_sentencepiece): <0xNN> BYTE; an added token CONTROL when special or when it
  looks special (<mask>, <unusedN>), else USER_DEFINED with U+2581 written as a space.
  (LlamaHfVocab alone would type <start_of_turn> NORMAL: no text could ever produce it.)
"""
import json
import re
import struct
import sys
from pathlib import Path

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


def gguf_str(s):
    b = s.encode('utf-8')
    return struct.pack('<Q', len(b)) + b


def gguf_value(v):
    """(type, bytes) of a value: str, bool, int (u32), or a list of one of str/int/float."""
    if isinstance(v, str):
        return T_STR, gguf_str(v)
    if isinstance(v, bool):
        return T_BOOL, struct.pack('<?', v)
    if isinstance(v, int):
        return T_U32, struct.pack('<I', v)
    kind, items = v
    if kind == 'str':
        body = b''.join(gguf_str(s) for s in items)
        et = T_STR
    elif kind == 'i32':
        body, et = struct.pack(f'<{len(items)}i', *items), T_I32
    else:
        body, et = struct.pack(f'<{len(items)}f', *items), T_F32
    return T_ARR, struct.pack('<IQ', et, len(items)) + body


def write_gguf(path, kv):
    out = [b'GGUF', struct.pack('<IQQ', 3, 0, len(kv))]
    for key, v in kv:
        t, body = gguf_value(v)
        out += [gguf_str(key), struct.pack('<I', t), body]
    data = b''.join(out)
    data += b'\0' * (-len(data) % 32)  # general.alignment: the (empty) tensor data starts here
    tmp = Path(f'{path}.tmp')
    tmp.write_bytes(data)
    tmp.replace(path)  # never a half-written file under the final name


def special_vocab(tok, cfg):
    """SpecialVocab(load_merges=True): merges, special ids and add_* flags (gguf-py vocab.py)."""
    merges = tok['model']['merges']
    if merges and not isinstance(merges[0], str):  # [left, right] pairs (transformers >= 4.45)
        merges = [' '.join(''.join(chr(ord(c) + 256) if c == ' ' else c for c in part) for part in pair)
                  for pair in merges]
    added = tok.get('added_tokens', [])
    add = {}
    post = tok.get('post_processor') or {}
    for proc in post.get('processors', [post]):
        single = proc.get('single', []) if proc.get('type') == 'TemplateProcessing' else []
        if len(single) > 1:
            first = single[0].get('SpecialToken', {}).get('id')
            if first:
                add['bos'] = first in (cfg.get('bos_token'), cfg.get('cls_token'))
            last = single[-1].get('SpecialToken', {}).get('id')
            if last:
                add['eos'] = last == cfg.get('eos_token')
            # the pair template's separator: A [sep] B, without its leading/trailing specials
            pair = proc.get('pair', [])
            pair = pair[1 if first and pair and pair[0].get('SpecialToken', {}).get('id') == first else 0:]
            if last and pair and pair[-1].get('SpecialToken', {}).get('id') == last:
                pair = pair[:-1]
            middle = pair[1:-1]
            if middle and pair[0].get('Sequence', {}).get('id') == 'A' and pair[-1].get('Sequence', {}).get('id') == 'B':
                entries = [m.get('SpecialToken', {}).get('id') for m in middle[:2]]
                seps = (cfg.get('sep_token'), cfg.get('eos_token'))
                add['sep'] = (entries[0] in seps and not last) or (len(entries) == 2 and entries[1] in seps)
    ids = {}
    for typ in ('bos', 'eos', 'unk', 'sep', 'pad', 'cls', 'mask'):
        if isinstance(cfg.get(f'add_{typ}_token'), bool):
            add[typ] = cfg[f'add_{typ}_token']
        entry = cfg.get(f'{typ}_token')
        content = entry.get('content') if isinstance(entry, dict) else entry
        if isinstance(content, str):
            tid = next((a['id'] for a in added if a['content'] == content), None)
            if tid is not None:
                ids[typ] = tid
    return merges, ids, add


def looks_special(text):
    """TextModel.does_token_look_special"""
    return (text in ('<pad>', '<mask>', '<2mass>', '[@BOS@]') or (text.startswith('<|') and text.endswith('|>'))
            or (text.startswith('<｜') and text.endswith('｜>')) or (text.startswith('<unused') and text.endswith('>')))


GPT2_ARCH = {'tekken': 'llama', 'deepseek-v3': 'deepseek2'}  # byte-level BPE kinds: their architecture


def gpt2_tokens(tok):
    """TextModel.get_vocab_base over tokenizer.json: every id's text and type."""
    vocab = dict(tok['model']['vocab'])
    added = {a['content']: a for a in tok['added_tokens']}
    vocab.update({a['content']: a['id'] for a in tok['added_tokens']})
    rev = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(max(rev) + 1):
        if i not in rev:
            tokens.append(f'[PAD{i}]')
            types.append(UNUSED)
            continue
        s = rev[i]
        if s in added:
            if added[s]['special'] or looks_special(s):
                types.append(CONTROL)
            else:
                s = s.replace('\u2581', ' ')
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(s)
    return tokens, types


def gemma_tokens(tok, cfg):
    """LlamaHfVocab.all_tokens (the model's vocabulary in id order, then the added tokens past it),
    typed as _create_vocab_sentencepiece types the same ids."""
    rev = {i: s for s, i in tok['model']['vocab'].items()}
    n_base = len(rev)
    tokens = [rev[i] for i in range(n_base)]
    types = [BYTE if re.fullmatch(r'<0x[0-9A-Fa-f]{2}>', s) else NORMAL for s in tokens]
    past = sorted((a for a in tok['added_tokens'] if a['id'] >= n_base), key=lambda a: a['id'])
    for a in past:
        tokens.append(a['content'])
        types.append(CONTROL if a['special'] else USER_DEFINED)
    for key, a in cfg.get('added_tokens_decoder', {}).items():
        i, s = int(key), a['content']
        if a.get('special') or looks_special(s):
            types[i] = CONTROL
        else:
            s = s.replace('\u2581', ' ')
            types[i] = USER_DEFINED
        tokens[i] = s
    return tokens, types


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ('tekken', 'deepseek-v3', 'gemma'):
        sys.exit(__doc__)
    kind, pkg, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    tok = json.loads((pkg / 'models' / 'tokenizer.json').read_text(encoding='utf-8'))
    cfg = json.loads((pkg / 'models' / 'tokenizer_config.json').read_text(encoding='utf-8'))
    merges, ids, add = special_vocab(tok, cfg)
    if kind in GPT2_ARCH:
        tokens, types = gpt2_tokens(tok)
        kv = [('general.architecture', GPT2_ARCH[kind]), ('tokenizer.ggml.model', 'gpt2'), ('tokenizer.ggml.pre', kind)]
    else:
        tokens, types = gemma_tokens(tok, cfg)
        kv = [('general.architecture', 'gemma4'), ('tokenizer.ggml.model', 'gemma4'),
              ('tokenizer.ggml.scores', ('f32', [-1000.0] * len(tokens)))]
    kv += [('tokenizer.ggml.tokens', ('str', tokens)), ('tokenizer.ggml.token_type', ('i32', types)),
           ('tokenizer.ggml.merges', ('str', merges))]
    names = {'bos': 'bos', 'eos': 'eos', 'unk': 'unknown', 'sep': 'seperator', 'pad': 'padding', 'cls': 'cls',
             'mask': 'mask'}  # gguf-py's key names (sic: "seperator")
    kv += [(f'tokenizer.ggml.{names[t]}_token_id', i) for t, i in ids.items()]
    if kind == 'gemma':  # set after SpecialVocab, so these win
        add['bos'] = True
        kv.append(('tokenizer.ggml.add_space_prefix', False))
    kv += [(f'tokenizer.ggml.add_{t}_token', v) for t, v in add.items()]
    if isinstance(cfg.get('chat_template'), str):
        kv.append(('tokenizer.chat_template', cfg['chat_template']))
    write_gguf(out, kv)
    print(f'{out}: {len(tokens)} tokens, {len(merges)} merges, special ids {ids}, add {add}')


if __name__ == '__main__':
    main()
