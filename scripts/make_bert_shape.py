#!/usr/bin/env python3
"""make_bert_shape.py - a random-weight BERT encoder of a published model's shape as a GGUF, for
speed runs on the GPU machine (issue 29: embeddings/s of a bge-small / all-MiniLM shape against
llama-server on the same file).  `inferd mkmodel` writes decoders only; this makes a Hugging Face
BertModel with seeded random weights, a WordPiece vocabulary trained on the reference kit's corpus
(../shared/reference/make_reference.py: build_wordpiece) and sentence-transformers' mean pooling,
and converts it with llama.cpp's own convert_hf_to_gguf.py through make_reference.py --convert
(which supplies the pre-tokenizer that a random vocabulary has no hash for).  Needs torch,
transformers and tokenizers: the GPU machine has them, this one does not.

usage: make_bert_shape.py --lcpp LLAMA_CPP_DIR --reference ../shared/reference --out FILE.gguf
           [--hidden 384 --layers 12 --heads 12 --ff 1536 --vocab 30522 --positions 512]
           [--outtype f16|f32|q8_0]
LLAMA_CPP_DIR: the peer's source tree (../shared/peers/build-llama.cpp unpacks it, /tmp/llama.cpp).
The defaults are bge-small-en-v1.5's (and all-MiniLM-L12's but for its 384 positions)."""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lcpp", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--outtype", default="f16")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.reference).resolve()))
    import make_reference as R  # noqa: E402 (the kit's tokenizer trainer)
    import torch
    from transformers import BertConfig, BertModel

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "hf"
        n_vocab, _ = R.build_wordpiece(d, a.vocab)  # as many pieces as its corpus yields, up to --vocab
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=n_vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, intermediate_size=a.ff, max_position_embeddings=a.positions,
                         type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
        BertModel(cfg).save_pretrained(str(d))
        (d / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (d / "1_Pooling").mkdir(exist_ok=True)
        (d / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": a.hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
             "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
        subprocess.run([sys.executable, str(Path(a.reference) / "make_reference.py"), "--convert", a.lcpp, str(d),
                        a.out, a.outtype, "default"], check=True)
    print(f"{a.out}: BERT {a.hidden} x {a.layers} layers, {a.heads} heads, FFN {a.ff}, {n_vocab} pieces, "
          f"{a.positions} positions ({a.outtype})")


if __name__ == "__main__":
    main()
