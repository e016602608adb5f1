#!/usr/bin/env bash
# hpd-run as a user calls it: output format, repeatability, prompts files,
# both weight namings, and exit status 2 with a message for every bad input.
set -u
run=$1
mkmodel=$2
tokenize=$3
tmp=$(mktemp -d /tmp/hpd-test-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check.sh"

"$mkmodel" --out "$tmp/next" --seed 3 --arch qwen3_next || exit 1
"$mkmodel" --out "$tmp/q35" --seed 3 --arch qwen3_5 --shards 2 || exit 1

prompt=$(seq -s, 1 70)
out1=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12)
check "exit 0" test $? -eq 0
check "one line of 12 integers" bash -c '[[ "$1" =~ ^[0-9]+( [0-9]+){11}$ ]]' _ "$out1"
out2=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12)
check "repeatable" test "$out1" = "$out2"
out3=$("$run" --model "$tmp/q35" --prompt-ids "$prompt" --max-tokens 12)
check "qwen3.5 naming gives the same tokens" test "$out1" = "$out3"
out4=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --kv-layout 16,2,hnd)
check "layout does not change tokens" test "$out1" = "$out4"
s1=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --temperature 0.9 --top-p 0.9 --top-k 50 --seed 4)
s2=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --temperature 0.9 --top-p 0.9 --top-k 50 --seed 4)
s3=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --temperature 0.9 --top-p 0.9 --top-k 50 --seed 5)
check "seeded sampling repeatable" test "$s1" = "$s2"
check "another seed samples differently" test "$s1" != "$s3"

printf '%s\n5,6,7\n\n9\n' "$prompt" > "$tmp/prompts"
multi=$("$run" --model "$tmp/next" --prompts-file "$tmp/prompts" --max-tokens 12)
check "prompts file: one line per prompt" test "$(echo "$multi" | wc -l)" -eq 3
check "prompts file: batch equals alone" test "$(echo "$multi" | head -1)" = "$out1"
alone3=$("$run" --model "$tmp/next" --prompt-ids 9 --max-tokens 12)
check "prompts file: last line equals alone" test "$(echo "$multi" | tail -1)" = "$alone3"

# tensor parallelism: CPU ranks give --tp 1's tokens and logits bits
"$run" --model "$tmp/next" --prompts-file "$tmp/prompts" --max-tokens 12 --logits-out "$tmp/tp1.logits" > "$tmp/tp1.out"
"$run" --model "$tmp/next" --prompts-file "$tmp/prompts" --max-tokens 12 --logits-out "$tmp/tp2.logits" --tp 2 --threads 2 > "$tmp/tp2.out"
check "--tp 2: exit 0, tokens of --tp 1" cmp -s "$tmp/tp1.out" "$tmp/tp2.out"
check "--tp 2: logits of --tp 1, bit for bit" cmp -s "$tmp/tp1.logits" "$tmp/tp2.logits"
"$run" --model "$tmp/next" --prompts-file "$tmp/prompts" --max-tokens 12 --logits-out "$tmp/tpf.logits" --tp 2 --tp-fast > "$tmp/tpf.out"
check "--tp 2 --tp-fast: other bits (the check can fail)" bash -c '! cmp -s "$1" "$2"' _ "$tmp/tp1.logits" "$tmp/tpf.logits"

# prefix cache: same tokens on and off, hits reported in --stats-json
base=$(seq -s, 1 200)
printf '%s,7,8,9\n%s,10,11\n%s,7,8,9\n%s\n' "$base" "$base" "$base" "$(seq -s, 1 70)" > "$tmp/shared"
on=$("$run" --model "$tmp/next" --prompts-file "$tmp/shared" --max-tokens 6 --max-batch 1 --stats-json "$tmp/stats.json")
off=$("$run" --model "$tmp/next" --prompts-file "$tmp/shared" --max-tokens 6 --no-prefix-cache --stats-json "$tmp/off.json")
check "prefix cache on = off" test "$on" = "$off"
cached() { grep -o '"cached_tokens": [0-9]*' "$1" | awk '{print $2}' | paste -sd' '; }
check "cached tokens per request (cache on)" test "$(cached "$tmp/stats.json")" = "0 192 192 0"
check "cached tokens per request (cache off)" test "$(cached "$tmp/off.json")" = "0 0 0 0"
check "cache counters in the stats" grep -q '"hit_tokens_device": 384' "$tmp/stats.json"
check "no cache: null counters" grep -q '"prefix_cache": null' "$tmp/off.json"

# stop tokens: --stop-ids ends at the first of them (it is the last token
# printed), --min-tokens lets earlier ones pass, --stats-json says why each
# request ended
read -r -a toks <<< "$out1"
stop=${toks[4]}
first=0
while [ "${toks[$first]}" != "$stop" ]; do first=$((first + 1)); done
want=$(echo "${toks[@]:0:$((first + 1))}")
got=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --stop-ids "$stop,$stop" --stats-json "$tmp/stop.json")
check "stop ids: output ends at the stop token" test "$got" = "$want"
check "stop ids: finish reason stop" grep -q '"finish_reason": "stop"' "$tmp/stop.json"
"$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --stats-json "$tmp/len.json" > /dev/null
check "no stop: finish reason length" grep -q '"finish_reason": "length"' "$tmp/len.json"
got=$("$run" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 12 --stop-ids "$stop" --min-tokens 12)
check "min tokens: the stop token does not count before" test "$got" = "$out1"
# the model's end-of-sequence id, from generation_config.json, unless --ignore-eos
cp -r "$tmp/next" "$tmp/eos"
printf '{"eos_token_id": [%s]}\n' "$stop" > "$tmp/eos/generation_config.json"
got=$("$run" --model "$tmp/eos" --prompt-ids "$prompt" --max-tokens 12)
check "eos: output ends at the end-of-sequence token" test "$got" = "$want"
got=$("$run" --model "$tmp/eos" --prompt-ids "$prompt" --max-tokens 12 --ignore-eos)
check "ignore eos: the whole output" test "$got" = "$out1"
"$mkmodel" --out "$tmp/eos2" --seed 3 --arch qwen3_next --eos "$stop" || exit 1
got=$("$run" --model "$tmp/eos2" --prompt-ids "$prompt" --max-tokens 12)
check "hpd-mkmodel --eos: the model stops there" test "$got" = "$want"

# weights in their dtype: a BF16 (F16) model gives the tokens and the logits,
# bit for bit, of the same weights widened to F32 on disk
for d in bf16 f16; do
    "$mkmodel" --out "$tmp/$d" --seed 3 --arch qwen3_next --dtype $d || exit 1
    "$mkmodel" --out "$tmp/$d-wide" --seed 3 --arch qwen3_next --dtype f32 --round-to $d || exit 1
    a=$("$run" --model "$tmp/$d" --prompt-ids "$prompt" --max-tokens 12 --logits-out "$tmp/$d.logits")
    b=$("$run" --model "$tmp/$d-wide" --prompt-ids "$prompt" --max-tokens 12 --logits-out "$tmp/$d-wide.logits")
    check "$d weights: the tokens of the same weights in F32" test -n "$a" -a "$a" = "$b"
    check "$d weights: the logits of the same weights in F32, bit for bit" cmp -s "$tmp/$d.logits" "$tmp/$d-wide.logits"
done
check "bf16 and f16 models differ (the check can fail)" bash -c '! cmp -s "$1" "$2"' _ "$tmp/bf16.logits" "$tmp/f16.logits"

# text: hpd-mkmodel writes a tokenizer.json; --prompt TEXT is its encoding,
# --text prints the decoding of the generated ids
ptext="Hello, world! What is the capital of France?"
pids=$(printf '%s' "$ptext" | "$tokenize" --model "$tmp/next" encode | tr ' ' ',')
check "hpd-mkmodel writes tokenizer.json" test -s "$tmp/next/tokenizer.json"
a=$("$run" --model "$tmp/next" --prompt "$ptext" --max-tokens 12)
b=$("$run" --model "$tmp/next" --prompt-ids "$pids" --max-tokens 12)
check "--prompt TEXT: the tokens of its ids" test -n "$a" -a "$a" = "$b"
"$run" --model "$tmp/next" --prompt "$ptext" --max-tokens 12 --text > "$tmp/text.out"
echo "$a" | "$tokenize" --model "$tmp/next" decode --skip-special > "$tmp/text.want"
echo >> "$tmp/text.want"
check "--text: the generated ids decoded" cmp -s "$tmp/text.out" "$tmp/text.want"
"$mkmodel" --out "$tmp/small" --seed 3 --vocab 200 || exit 1
"$run" --model "$tmp/small" --prompt "hi" --max-tokens 2 > /dev/null 2> "$tmp/err"
check "--prompt without tokenizer.json: exit 1" test $? -eq 1
check "--prompt without tokenizer.json: says so" grep -q "tokenizer.json" "$tmp/err"

# generation defaults: a request that sets no temperature / top-p / top-k
# samples with generation_config.json's, unless --no-generation-defaults
"$mkmodel" --out "$tmp/gen" --seed 3 --arch qwen3_next --sampling 5,0.9,50 || exit 1
check "hpd-mkmodel --sampling writes the defaults" grep -q '"top_k": 50' "$tmp/gen/generation_config.json"
dflt=$("$run" --model "$tmp/gen" --prompt-ids "$prompt" --max-tokens 12 --seed 7)
expl=$("$run" --model "$tmp/gen" --prompt-ids "$prompt" --max-tokens 12 --seed 7 --temperature 5 --top-p 0.9 --top-k 50)
check "defaults: the model's sampling values" test "$dflt" = "$expl"
check "defaults: they sample (not greedy)" test "$dflt" != "$out1"
got=$("$run" --model "$tmp/gen" --prompt-ids "$prompt" --max-tokens 12 --seed 7 --no-generation-defaults)
check "--no-generation-defaults: greedy" test "$got" = "$out1"
got=$("$run" --model "$tmp/gen" --prompt-ids "$prompt" --max-tokens 12 --seed 7 --temperature 0)
check "a request's own temperature wins" test "$got" = "$out1"
printf '{"do_sample": false, "temperature": 5}\n' > "$tmp/gen/generation_config.json"
got=$("$run" --model "$tmp/gen" --prompt-ids "$prompt" --max-tokens 12 --seed 7)
check "do_sample false: greedy" test "$got" = "$out1"
printf '{"top_p": 2}\n' > "$tmp/gen/generation_config.json"
"$run" --model "$tmp/gen" --prompt-ids 1 > "$tmp/out" 2> "$tmp/err"
check "bad top_p in generation_config.json: exit 1" test $? -eq 1
check "bad top_p in generation_config.json: named" grep -q "generation_config.json: top_p" "$tmp/err"

expect_2() { # expect_2 NAME WORD ARGS... : exit 2, nothing on stdout, WORD on stderr
    local name=$1 word=$2
    shift 2
    "$run" "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    check "$name: exit 2 (got $rc)" test $rc -eq 2
    check "$name: stdout empty" test ! -s "$tmp/out"
    check "$name: message mentions '$word'" grep -qi -- "$word" "$tmp/err"
}
expect_2 "empty prompt" "empty" --model "$tmp/next" --prompt-ids "" --max-tokens 4
expect_2 "id >= vocab" "vocab" --model "$tmp/next" --prompt-ids 1,1024,3 --max-tokens 4
expect_2 "negative id" "integer" --model "$tmp/next" --prompt-ids 1,-3 --max-tokens 4
expect_2 "too long" "maximum context" --model "$tmp/next" --prompt-ids "$prompt" --max-tokens 4 --max-context 50
expect_2 "unknown flag" "unrecognized" --model "$tmp/next" --prompt-ids 1 --frobnicate
expect_2 "no model" "--model" --prompt-ids 1
expect_2 "bad block size" "multiple of 16" --model "$tmp/next" --prompt-ids 1 --kv-block-size 24
expect_2 "bad top-p" "top-p" --model "$tmp/next" --prompt-ids 1 --top-p 1.5
expect_2 "bad stop ids" "--stop-ids" --model "$tmp/next" --prompt-ids 1 --stop-ids 1,x
expect_2 "stop id >= vocab" "stop token" --model "$tmp/next" --prompt-ids 1,2 --stop-ids 99999
expect_2 "bad layout" "layout" --model "$tmp/next" --prompt-ids 1 --kv-layout 64,nhd
expect_2 "tp 3" "tp 3 does not divide the full-attention layers. query heads, 4" --model "$tmp/next" --prompt-ids 1 --tp 3
expect_2 "tp 4 over 2 GDN key heads" "key heads, 2" --model "$tmp/next" --prompt-ids 1 --tp 4
expect_2 "tp 9" "tp" --model "$tmp/next" --prompt-ids 1 --tp 9

"$run" --model "$tmp/nowhere" --prompt-ids 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
check "missing model: exit 1 (got $rc)" test $rc -eq 1
check "missing model: names the file" grep -q "nowhere/config.json" "$tmp/err"

finish
