#!/usr/bin/env bash
# From a fresh clone on Debian 12: installs the packages, builds, writes the
# tiny random model, brings up deploy/examples/local.yaml with hpdctl (a
# coordinator, a prefill node and a decode node with different KV layouts,
# on 127.0.0.1), streams a few requests through hpd-client, prints the
# answers and a summary (TTFT, TPOT, prefix-cache hits), checks the tokens
# against a single engine (hpd-run), talks text through the OpenAI-compatible
# HTTP API with curl and through hpd-client chat, and stops the cluster with
# hpdctl down.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh
model=models/tiny
[ -f "$model/config.json" ] || ./build/tools/hpd-mkmodel --out "$model" --seed 1

manifest=deploy/examples/local.yaml
hpdctl=./build/deploy/hpdctl
"$hpdctl" down "$manifest" > /dev/null # a cluster left from an earlier run
trap '"$hpdctl" down "$manifest"' EXIT
echo "== hpdctl up $manifest"
"$hpdctl" up "$manifest"

run=$(mktemp -d /tmp/hpd-quickstart-XXXXXX)
# the client key hpdctl up wrote beside the node secret (the secret is no
# client key: docs/cluster.md, "Credentials")
client=(./build/client/hpd-client --coordinator 127.0.0.1:17600 --token-file .hpd/local/client-keys)
# three prompts sharing a 200-token prefix, then a sampled one
base=$(seq -s, 1 200)
printf '%s,7,8,9\n%s,10,11\n%s,12\n' "$base" "$base" "$base" > "$run/prompts"
echo "== hpd-client generate --stream: 3 prompts with a shared 200-token prefix, 24 tokens each"
"${client[@]}" generate --prompts-file "$run/prompts" --max-tokens 24 --stream \
    --concurrency 1 --stats-json "$run/stats.json" | tee "$run/cluster.out"
echo "== the same prompt sampled (temperature 0.8, top-p 0.9, seed 7)"
"${client[@]}" generate --prompt-ids "$base" --max-tokens 24 --temperature 0.8 --top-p 0.9 \
    --seed 7 --stream

awk '/"ttft_ms"/ {gsub(/,/, ""); t += $2; n++} /"tpot_ms"/ {gsub(/,/, ""); p += $2}
     /"cached_tokens"/ {gsub(/,/, ""); c += $2} /"prompt_tokens"/ {gsub(/,/, ""); q += $2}
     END {printf "== summary: %d requests, mean TTFT %.1f ms, mean TPOT %.2f ms, %d of %d prompt tokens from the prefix cache\n", n, t / n, p / n, c, q}' \
    "$run/stats.json"
./build/tools/hpd-run --model "$model" --prompts-file "$run/prompts" --max-tokens 24 \
    > "$run/single.out"
if cmp -s "$run/cluster.out" "$run/single.out"; then
    echo "== the cluster's tokens equal a single engine's (hpd-run): yes"
else
    echo "== the cluster's tokens differ from hpd-run's" >&2
    exit 1
fi
key=$(head -n1 .hpd/local/client-keys | cut -d' ' -f1)
echo "== curl the OpenAI-compatible API (docs/api.md): POST /v1/chat/completions"
echo "   (a random model: random words, through the real path)"
curl -sS http://127.0.0.1:17602/v1/chat/completions -H "Authorization: Bearer $key" \
    -d '{"model": "tiny", "messages": [{"role": "user", "content": "What is the capital of France?"}],
         "max_tokens": 24, "chat_template_kwargs": {"enable_thinking": false}}'
echo "== the same question, streamed (server-sent events), stopping at the first period"
curl -sSN http://127.0.0.1:17602/v1/completions -H "Authorization: Bearer $key" \
    -d '{"prompt": "The capital of France is", "max_tokens": 24, "stream": true, "stop": ["."]}' |
    sed -n '1,4p;/DONE/p' # the first events and the end
echo "== hpd-client chat (the coordinator tokenizes and decodes)"
"${client[@]}" chat --prompt "What is the capital of France?" --max-tokens 24 --thinking off \
    --stream
echo "== hpdctl status"
"$hpdctl" status "$manifest"
if command -v curl > /dev/null; then
    echo "== prefill-0 /metrics (excerpt)"
    curl -s 127.0.0.1:17611/metrics | grep -E '^hpd_(prefix_cache_hit|xfer_bytes|jobs_total)' || true
fi
echo "== hpdctl down $manifest"
trap - EXIT
"$hpdctl" down "$manifest"
