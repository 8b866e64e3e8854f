#!/usr/bin/env python3
"""The expected renderings of test_jinja.c's test_gpt_oss_template: tests/text/data/gpt-oss.jinja
(gpt-oss's published chat template, as its GGUF carries it) over the conversations of
data/gpt-oss-vectors.json, by Python jinja2 set up as transformers' apply_chat_template sets it
up (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson as json.dumps with
ensure_ascii=False, raise_exception, strftime_now at the fixed date 2026-01-15).  Writes each
conversation's "text" (or "error") back into the file.  Usage: python3 gen_gpt_oss_vectors.py"""
import datetime
import json
import os

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def raise_exception(msg):
    raise TemplateError(msg)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.datetime(2026, 1, 15, 12, 0, 0).strftime(fmt)
with open(os.path.join(HERE, "gpt-oss.jinja")) as f:
    tmpl = env.from_string(f.read())
path = os.path.join(HERE, "gpt-oss-vectors.json")
with open(path) as f:
    vectors = json.load(f)
for conv in vectors["conversations"]:
    ctx = dict(conv["context"])
    conv.pop("text", None)
    conv.pop("error", None)
    try:
        conv["text"] = tmpl.render(**ctx)
    except TemplateError as e:
        conv["error"] = str(e)
with open(path, "w") as f:
    json.dump(vectors, f, ensure_ascii=False, indent=1)
    f.write("\n")
