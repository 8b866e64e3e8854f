#!/usr/bin/env bash
# test 'cli': the real inferd binary (env INFERD_BIN) on models made by `inferd mkmodel`:
# mkmodel per architecture, info, generate (text + throughput lines, determinism, --chat),
# bench (table + valid JSON lines), scripts/make-default-model, and flag errors.
set -uo pipefail
bin="${INFERD_BIN:?INFERD_BIN must point to the inferd binary}"
src="${INFERD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
tmp="$(mktemp -d /tmp/inferd-cli-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# expect_rc WANT CMD...: run, keep stdout/stderr in $tmp/out, $tmp/err
expect_rc() {
    local want="$1"; shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" != "$want" ]; then
        fail "exit $rc (want $want): $*"; sed 's/^/  stderr: /' "$tmp/err" | head -5 >&2
        return 1
    fi
}
expect_grep() { # PATTERN FILE WHAT
    grep -Eq -- "$1" "$2" || { fail "$3: no line matching /$1/ in $(basename "$2")"; head -5 "$2" | sed 's/^/  /' >&2; }
}

# --- mkmodel + info, one per architecture --------------------------------------------------
for arch in llama qwen2 qwen3; do
    m="$tmp/tiny-$arch.gguf"
    expect_rc 0 "$bin" mkmodel -o "$m" --arch "$arch" --seed 7 || continue
    expect_grep "wrote .*\($arch, f32" "$tmp/err" "mkmodel $arch summary"
    [ -s "$m" ] || fail "mkmodel $arch wrote no file"
    expect_rc 0 "$bin" info "$m" && {
        expect_grep "general.architecture +str +\"$arch\"" "$tmp/out" "info $arch architecture"
        expect_grep "tokenizer.ggml.model +str +\"gpt2\"" "$tmp/out" "info $arch tokenizer"
        expect_grep "tokenizer.chat_template" "$tmp/out" "info $arch chat template"
        expect_grep "^recipe: $arch, [0-9]+ layers, rope $([ $arch = llama ] && echo normal || echo neox)," \
            "$tmp/out" "info $arch recipe"
        extra=$(case $arch in qwen2) echo " \\+ qkv bias" ;; qwen3) echo " \\+ qk norm" ;; esac)
        expect_grep "^  layers? [0-9-]+: pre-norm, full attention$extra, GLU silu$" "$tmp/out" "info $arch layer recipe"
    }
done
model="$tmp/tiny-llama.gguf"
# A family no descriptor knows (every "llama" renamed, keys included): info still shows the
# file, then why the model is refused.
LC_ALL=C sed 's/llama/llamx/g' "$model" >"$tmp/unknown-family.gguf"
expect_rc 0 "$bin" info "$tmp/unknown-family.gguf" &&
    expect_grep "^model: refused: .*general.architecture 'llamx' is not supported \(llama, qwen2, qwen3, qwen3moe, gemma3, gemma4, qwen35, qwen35moe, qwen3next, bert, gpt-oss, phi3, glm4moe, deepseek2, nomic-bert, jina-bert-v2\)" \
        "$tmp/out" "info of an unknown family"
# The reference models (../shared/reference, when present): `inferd info` of FILE must print
# a line matching each PATTERN.
reference_info() { # FILE PATTERN...
    local file="${INFERD_SHARED_DIR:-$(dirname "$0")/../../../shared}/reference/$1"
    shift
    if [ ! -f "$file" ]; then
        echo "SKIP: $file not present (its info check)"
        return
    fi
    expect_rc 0 "$bin" info "$file" || return
    local pattern
    for pattern in "$@"; do expect_grep "$pattern" "$tmp/out" "info $(basename "$file")"; done
}
# A mixture of experts: the MoE recipe and its experts.
reference_info qwen3moe.gguf \
    "^  layers 0-2: pre-norm, full attention \+ qk norm, MoE silu \(softmax top-k router, renormalised\)$" \
    "^  experts: 8 per MoE layer, 2 per token, hidden width 32$"
# GLM-4.5: a dense first layer, then sigmoid-routed MoE layers with a shared expert; partial RoPE.
reference_info glm4moe.gguf \
    "^  layer 0: pre-norm, full attention \+ qkv bias \+ qk norm \+ partial RoPE, GLU silu$" \
    "^  layers 1-2: pre-norm, full attention \+ qkv bias \+ qk norm \+ partial RoPE, MoE silu \(sigmoid router \+ selection bias, renormalised, scaled\) \+ shared expert$" \
    "^  rope: the first 16 of 32 dims of each head$" \
    "^  experts: 8 per MoE layer, 2 per token, hidden width 32, shared expert width 32$"
# Phi-3: fused tensors, partial RoPE and LongRoPE, which the loader reads from the file.
reference_info phi3.gguf \
    "^  layers 0-2: pre-norm, full attention \+ fused qkv \+ partial RoPE \+ LongRoPE, GLU silu \(fused gate/up\)$" \
    "^  rope: LongRoPE factors \(long past 4096 tokens\), attention factor 1.19024$"

# --- generate --------------------------------------------------------------------------------
if expect_rc 0 "$bin" generate -m "$model" -p "The scheduler packs prompts" -n 12 --temp 0 --threads 1; then
    expect_grep '^prompt tokens: [1-9][0-9]*$' "$tmp/err" "generate prompt tokens"
    expect_grep '^prefill: [0-9.]+ tok/s' "$tmp/err" "generate prefill rate"
    expect_grep '^decode: [0-9.]+ tok/s \([0-9]+ tokens generated' "$tmp/err" "generate decode rate"
    cp "$tmp/out" "$tmp/greedy1"
    expect_rc 0 "$bin" generate -m "$model" -p "The scheduler packs prompts" -n 12 --temp 0 --threads 2
    cmp -s "$tmp/out" "$tmp/greedy1" || fail "greedy generation differs between runs"
fi
# Sampled text: some seed out of a few must print visible text (a random model may pick an
# end-of-turn token first), and the same seed must print the same text.
printed=0
for seed in 1 2 3 4 5 6 7 8; do
    expect_rc 0 "$bin" generate -m "$model" -p "Hello" -n 16 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed "$seed" || break
    if grep -q '[^[:space:]]' "$tmp/out"; then
        printed=1
        cp "$tmp/out" "$tmp/sampled"
        expect_rc 0 "$bin" generate -m "$model" -p "Hello" -n 16 --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed "$seed"
        cmp -s "$tmp/out" "$tmp/sampled" || fail "seeded generation is not reproducible (seed $seed)"
        n=$(sed -n 's/^decode: .*(\([0-9]*\) tokens generated.*/\1/p' "$tmp/err")
        [ "${n:-0}" -ge 1 ] && [ "${n:-0}" -le 16 ] || fail "generated token count '$n' not in 1..16"
        break
    fi
done
[ "$printed" = 1 ] || fail "generate printed no text for any of 8 seeds"
expect_rc 0 "$bin" generate -m "$tmp/tiny-qwen2.gguf" -p "Hi there" -n 8 --chat --seed 3 &&
    expect_grep '^prompt tokens: ([89]|[1-9][0-9]+)$' "$tmp/err" "chat prompt includes the template tokens"

# --- bench -----------------------------------------------------------------------------------
if expect_rc 0 "$bin" bench -m "$model" --prompt 32,64 --batch 1,3 --gen 4 --ubatch 16 --threads 1; then
    expect_grep '^model: inferd-tiny' "$tmp/out" "bench model line"
    expect_grep '^weights: [0-9.]+ MiB' "$tmp/out" "bench weights line"
    expect_grep '^backend: cpu' "$tmp/out" "bench backend line"
    expect_grep '^prefill +64 +1 +64 ' "$tmp/out" "bench prefill row"
    expect_grep '^decode +16 +3 +12 ' "$tmp/out" "bench decode row"
    [ "$(grep -c '^{' "$tmp/out")" = 4 ] || fail "bench: want 4 JSON lines"
    if command -v python3 >/dev/null; then
        grep '^{' "$tmp/out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
assert [r["test"] for r in rows] == ["prefill", "prefill", "decode", "decode"], rows
assert all(r["tokens_per_s"] > 0 and r["backend"] == "cpu" for r in rows), rows
assert rows[3]["batch"] == 3 and rows[3]["n_tokens"] == 12, rows
' || fail "bench JSON lines"
    fi
fi
# speculative verification rows (--draft): one per batch, K + 1 tokens per sequence and step,
# and the tok/s at each acceptance rate beside the decode's; --accept: speculative decoding of
# drafts that are the model's own greedy tokens with probability P (100: every one accepted,
# K + 1 tokens a step, each the decoded continuation's; 40: some rejected, none differing: the
# CPU's logits of a position do not depend on the step's width)
if expect_rc 0 "$bin" bench -m "$model" --prompt 32 --batch 1,3 --gen 4 --ubatch 16 --threads 1 --reps 1 --draft 3 \
        --accept 40,100; then
    expect_grep '^verify +16 +3 +48 ' "$tmp/out" "bench verify row"
    expect_grep '^verify batch 3, 3 drafts: decode [0-9.]+ tok/s; at acceptance 0.00: [0-9.]+ \(1.00 tok/step\).* 1.00: [0-9.]+ \(4.00 tok/step\)' \
        "$tmp/out" "bench acceptance line"
    [ "$(grep -c '^{"test":"verify"' "$tmp/out")" = 2 ] || fail "bench: want 2 verify JSON lines"
    expect_grep '^spec +16 +3 +48 ' "$tmp/out" "bench spec row at 100 %"
    expect_grep '^spec batch 3, 3 drafts, drafts the model.s own with p 1.00: 36 of 36 accepted \(100.0 %\), 4.00 tok/step, [0-9.]+ tok/s = [0-9.]+x decode' \
        "$tmp/out" "bench spec line at 100 %"
    expect_grep '^spec batch 1, 3 drafts, drafts the model.s own with p 0.40: [0-9]+ of 12 accepted' "$tmp/out" "bench spec line at 40 %"
    grep -q 'differ' "$tmp/out" && fail "bench spec: accepted tokens differ from the decoded continuation on the CPU"
fi
# with a draft model (the model as its own): draft rows, and the acceptance line that counts
# K draft steps per speculative step; --model-draft without --draft is a usage error
if expect_rc 0 "$bin" bench -m "$model" --prompt 32 --batch 1,3 --gen 4 --ubatch 16 --threads 1 --reps 1 --draft 3 \
        --model-draft "$model" --accept 100; then
    expect_grep '^draft +16 +3 +12 ' "$tmp/out" "bench draft row"
    expect_grep '^spec-dm +16 +3 +48 ' "$tmp/out" "bench spec row with the draft model"
    expect_grep "^spec batch 3, 3 drafts \\(draft model's cost\\), drafts the model.s own with p 1.00: 36 of 36 accepted" \
        "$tmp/out" "bench spec line with the draft model"
    expect_grep '^verify batch 3, 3 drafts by the draft model: decode [0-9.]+ tok/s; at acceptance 0.00: [0-9.]+ \(1.00 tok/step\)' \
        "$tmp/out" "bench draft acceptance line"
    [ "$(grep -c '^{"test":"draft","model":"inferd-tiny"' "$tmp/out")" = 2 ] || fail "bench: want 2 draft JSON lines"
fi
expect_rc 2 "$bin" bench -m "$model" --model-draft "$model" && expect_grep 'give --draft K' "$tmp/err" "--model-draft without --draft"
expect_rc 2 "$bin" bench -m "$model" --accept 50 && expect_grep 'give --draft K' "$tmp/err" "--accept without --draft"
# an encoder (mkmodel's nomic-bert) is timed as an embedding server runs it: N inputs of T tokens
# packed whole into steps of --ubatch tokens (20 / 16: one input a step; 40 / 16: two), pooled as
# its file says (mean), embeddings/s beside tok/s; a decoder with --pooling last likewise
nomic="$tmp/tiny-nomic.gguf"
if expect_rc 0 "$bin" mkmodel -o "$nomic" --arch nomic-bert --seed 3 &&
    expect_rc 0 "$bin" bench -m "$nomic" --prompt 16,32 --batch 1,5 --ubatch 40 --threads 1 --reps 1; then
    expect_grep '^embed +16 +1 +16 +[0-9.]+ +[0-9.]+ +[0-9.]+ embeddings/s$' "$tmp/out" "bench embed row (16 x 1)"
    expect_grep '^embed +32 +5 +160 ' "$tmp/out" "bench embed row (32 x 5)"
    grep -q '^prefill\|^decode' "$tmp/out" && fail "bench on an encoder timed prefill or decode"
    if command -v python3 >/dev/null; then
        grep '^{' "$tmp/out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
assert [(r["test"], r["n_prompt"], r["batch"]) for r in rows] == [
    ("embed", 16, 1), ("embed", 16, 5), ("embed", 32, 1), ("embed", 32, 5)], rows
assert all(r["pooling"] == "mean" and r["embeddings_per_s"] > 0 for r in rows), rows
r = rows[3]
assert abs(r["embeddings_per_s"] * 32 - r["tokens_per_s"]) <= 1e-3 * r["tokens_per_s"] + 0.05, r
' || fail "bench embed JSON lines"
    fi
fi
if expect_rc 0 "$bin" bench -m "$model" --pooling last --prompt 24 --batch 3 --threads 1 --reps 1; then
    expect_grep '^embed +24 +3 +72 ' "$tmp/out" "bench --pooling last row"
    expect_grep '"pooling":"last"' "$tmp/out" "bench --pooling last JSON"
fi
expect_rc 2 "$bin" bench -m "$model" --pooling maximum && expect_grep '--pooling' "$tmp/err" "bad --pooling named"

# --- scripts/make-default-model ----------------------------------------------------------------
out="$tmp/models/default.gguf"
if expect_rc 0 bash "$src/scripts/make-default-model" "$bin" "$out"; then
    [ -s "$out" ] || fail "make-default-model wrote no file"
    cmp -s "$out" "$tmp/tiny-llama.gguf" && fail "default model should use seed 1, not 7"
    before=$(stat -c %Y "$out")
    expect_rc 0 bash "$src/scripts/make-default-model" "$bin" "$out" &&
        expect_grep 'already exists' "$tmp/out" "make-default-model keeps an existing model"
    [ "$(stat -c %Y "$out")" = "$before" ] || fail "make-default-model rewrote an existing model"
    expect_rc 0 "$bin" generate -m "$out" -p "x" -n 2 --threads 1
    # the README's first example on it: whole lowercase words, greedy and sampled
    for temp in 0 1; do
        expect_rc 0 "$bin" generate -m "$out" -p "Once upon a time" -n 24 --temp $temp --seed 5 --threads 1 &&
            { grep -Eqx '( [a-z]+){24}' "$tmp/out" || fail "default model, temp $temp: not 24 words: $(cat "$tmp/out")"; }
    done
fi
expect_rc 1 "$bin" mkmodel -o "$tmp/x.gguf" --words "$tmp/no-such-words.txt" &&
    expect_grep 'no-such-words.txt: No such file' "$tmp/err" "mkmodel --words names a missing file"

# --- errors ------------------------------------------------------------------------------------
expect_rc 1 "$bin" generate -m "$tmp/missing.gguf" -p "x" && expect_grep 'missing.gguf' "$tmp/err" "missing model named"
expect_rc 2 "$bin" generate -m "$model" && expect_grep '-p TEXT' "$tmp/err" "generate without prompt"
expect_rc 2 "$bin" generate -m "$model" -p x --temp abc && expect_grep '--temp' "$tmp/err" "bad --temp named"
expect_rc 1 "$bin" generate -m "$model" -p x --device tpu && expect_grep 'tpu' "$tmp/err" "bad device named"
expect_rc 2 "$bin" mkmodel -o "$tmp/x.gguf" --type tq1_0 && expect_grep 'tq1_0' "$tmp/err" "bad type named"
expect_rc 2 "$bin" mkmodel -o "$tmp/x.gguf" --preset huge && expect_grep 'huge' "$tmp/err" "bad preset named"
expect_rc 1 "$bin" mkmodel -o "$tmp/x.gguf" --n-head-kv 3 && expect_grep 'n-head-kv' "$tmp/err" "bad head split named"
[ -e "$tmp/x.gguf" ] && fail "a refused mkmodel left a file"
# --head-dim apart from n-embd / n-head (llama-quantize's test files, scripts/lcpp-quant-compare), BF16
expect_rc 0 "$bin" mkmodel -o "$tmp/hd.gguf" --type bf16 --n-embd 256 --n-head 2 --head-dim 32 &&
    expect_grep "wrote .*\(llama, bf16" "$tmp/err" "mkmodel bf16 summary" &&
    expect_rc 0 "$bin" info "$tmp/hd.gguf" &&
    expect_grep "llama.attention.key_length +u32 +32" "$tmp/out" "mkmodel --head-dim written"
expect_rc 2 "$bin" bench -m "$model" --batch 1,,2 && expect_grep '--batch' "$tmp/err" "bad --batch named"

# bench on a 512-token model with the default 2048-token prefill: clamped, and said so
if expect_rc 0 "$bin" bench -m "$model" --prompt 64,2048,512 --batch 1 --gen 600 --reps 1 --threads 1; then
    expect_grep "prefill of 2048 tokens is beyond the model's context \(512\): measuring 512" "$tmp/err" "bench clamps the prefill"
    expect_grep "600 decode steps .* beyond the model's context \(512\): measuring 494" "$tmp/err" "bench clamps --gen"
    [ "$(grep -c '^prefill ' "$tmp/out")" = 2 ] || fail "bench: want the prefill rows 64 and 512 once each"
    expect_grep '^decode +16 +1 +494 ' "$tmp/out" "bench clamped decode row"
fi
# --context: decode after a longer prompt (prefilled in --ubatch chunks), clamped like --gen
if expect_rc 0 "$bin" bench -m "$model" --prompt 32 --batch 1,2 --gen 4 --context 100 --ubatch 32 --reps 1 --threads 1; then
    expect_grep '^decode +100 +1 +4 ' "$tmp/out" "bench decode row at --context 100"
    expect_grep '^decode +100 +2 +8 ' "$tmp/out" "bench batch-2 decode row at --context 100"
fi
if expect_rc 0 "$bin" bench -m "$model" --prompt 32 --batch 1 --gen 8 --context 600 --reps 1 --threads 1; then
    expect_grep "context is beyond the model's context \(512\): measuring 509" "$tmp/err" "bench clamps --context"
    expect_grep '^decode +509 +1 +1 ' "$tmp/out" "bench decode row at the clamped context"
fi
expect_rc 2 "$bin" bench -m "$model" --context 0 && expect_grep '--context' "$tmp/err" "bad --context named"

# --- the subcommand line -------------------------------------------------------------------------
expect_rc 2 "$bin" && expect_grep '^usage: inferd serve' "$tmp/err" "bare inferd prints the usage"
[ -s "$tmp/out" ] && fail "bare inferd printed to stdout"
grep -q ' error ' "$tmp/err" && fail "bare inferd printed a log line"
expect_rc 2 "$bin" frobnicate &&
    expect_grep "unknown subcommand 'frobnicate'.*serve generate info mkmodel bench" "$tmp/err" "unknown subcommand listed"
expect_rc 0 "$bin" --help && expect_grep '^ +inferd bench -m MODEL.gguf' "$tmp/out" "--help lists bench"
# flags alone still start the server (a unit file may run `inferd --config FILE`): here it stops
# at the missing model, as `inferd serve` does
expect_rc 2 "$bin" --port 1 && expect_grep 'no model given' "$tmp/err" "flags alone run serve"
expect_rc 1 "$bin" generate -m /nonexistent.gguf -p x &&
    [ "$(grep -o '/nonexistent.gguf' "$tmp/err" | wc -l)" = 1 ] || fail "generate names a missing model once: $(cat "$tmp/err")"
# serve --help: every description starts in one column (a long choice list once pushed its own)
if expect_rc 0 "$bin" serve --help; then
    cols=$(for d in 'GGUF model file to serve' 'debug, info, warn, error' 'serve Prometheus metrics' \
                    'address to listen on' 'compute backend'; do
               grep -F -- "$d" "$tmp/out" | awk -v d="$d" '{ print index($0, d) }'; done | sort -u | wc -l)
    [ "$cols" = 1 ] || fail "serve --help: descriptions start in $cols different columns"
fi

if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
fi
echo "cli: all checks passed"
