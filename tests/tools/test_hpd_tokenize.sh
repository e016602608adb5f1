#!/usr/bin/env bash
# hpd-tokenize as a user calls it: encode then decode gives the text back
# (NFC), ids equal to the committed expectations, exit 2 on bad usage or
# ids, 1 on a missing tokenizer.
set -u
tok=$1
dir=$2
tmp=$(mktemp -d /tmp/hpd-test-tokcli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check.sh"
model=$dir/qwen2.tokenizer.json
printf 'Hello, world! This is a test of the tokenizer.' > "$tmp/in"
ids=$("$tok" --model "$model" encode < "$tmp/in")
check "encode: one line of integers" bash -c '[[ "$1" =~ ^[0-9]+( [0-9]+)*$ ]]' _ "$ids"
want=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(map(str, d["tokenizers"]["qwen2"]["cases"][0]["ids"])))' "$dir/expected.json")
check "encode: the ids tokenizers gives" test "$ids" = "$want"
echo "$ids" | "$tok" --model "$model" decode > "$tmp/out"
check "decode(encode(x)) = x" cmp -s "$tmp/in" "$tmp/out"
printf '%s\n' "$(echo "$ids" | tr ' ' '\n')" | "$tok" --model "$model" decode > "$tmp/out2"
check "decode reads ids a line each" cmp -s "$tmp/in" "$tmp/out2"
printf '<|im_start|>hi<|im_end|>' | "$tok" --model "$model" encode > "$tmp/sp"
"$tok" --model "$model" decode --skip-special < "$tmp/sp" > "$tmp/sp.txt"
check "--skip-special leaves the special tokens out" test "$(cat "$tmp/sp.txt")" = "hi"
echo "1 x 2" | "$tok" --model "$model" decode > /dev/null 2> "$tmp/err"
check "bad ids: exit 2" test $? -eq 2
check "bad ids: named" grep -q "hpd-tokenize: decode" "$tmp/err"
echo "99999" | "$tok" --model "$model" decode > /dev/null 2> "$tmp/err"
check "an id outside the vocabulary: exit 2" test $? -eq 2
check "an id outside the vocabulary: named" grep -q "99999" "$tmp/err"
"$tok" --model "$model" frobnicate < /dev/null > /dev/null 2>&1
check "bad usage: exit 2" test $? -eq 2
"$tok" --model "$tmp/nowhere" encode < /dev/null > /dev/null 2> "$tmp/err"
check "missing tokenizer: exit 1" test $? -eq 1
finish
