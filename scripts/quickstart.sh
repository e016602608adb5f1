#!/usr/bin/env bash
# From a fresh clone: installs the packages, builds, writes the tiny random
# model, starts a local cluster on 127.0.0.1 (a coordinator, a prefill node
# and a decode node with different KV layouts), streams a few requests
# through hpd-client, checks them against hpd-run, shows the cluster's
# status and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh
model=models/tiny
[ -f "$model/config.json" ] || ./build/tools/hpd-mkmodel --out "$model" --seed 1

run=$(mktemp -d /tmp/hpd-quickstart-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
head -c 24 /dev/urandom | base64 > "$run/token"
export OMP_WAIT_POLICY=passive # three processes share the cores

echo "== starting a local cluster (logs in $run)"
./build/coordinator/hpd-coordinator --port 0 --port-file "$run/port" \
    --token-file "$run/token" > "$run/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -s "$run/port" ] && break; sleep 0.1; done
addr=127.0.0.1:$(cat "$run/port")
common=(--coordinator "$addr" --token-file "$run/token" --model "$model" --max-context 1024)
./build/prefill_node/hpd-prefill "${common[@]}" --name prefill-0 --kv-layout 64,1,nhd \
    > "$run/prefill-0.log" 2>&1 &
pids+=($!)
./build/decode_node/hpd-decode "${common[@]}" --name decode-0 --kv-layout 16,2,hnd \
    > "$run/decode-0.log" 2>&1 &
pids+=($!)
client=(./build/client/hpd-client --coordinator "$addr" --token-file "$run/token")
for _ in $(seq 100); do
    [ "$("${client[@]}" status 2>/dev/null | grep -cE ' (prefill|decode) ')" -eq 2 ] && break
    sleep 0.1
done

# three prompts sharing a 200-token prefix, then a sampled one
base=$(seq -s, 1 200)
printf '%s,7,8,9\n%s,10,11\n%s,12\n' "$base" "$base" "$base" > "$run/prompts"
echo "== hpd-client generate --stream: 3 prompts with a shared 200-token prefix, 24 tokens each"
"${client[@]}" generate --prompts-file "$run/prompts" --max-tokens 24 --stream \
    --concurrency 1 --stats-json "$run/stats.json" | tee "$run/cluster.out"
echo "== the same prompt sampled (temperature 0.8, top-p 0.9, seed 7)"
"${client[@]}" generate --prompt-ids "$base" --max-tokens 24 --temperature 0.8 --top-p 0.9 \
    --seed 7 --stream

./build/tools/hpd-run --model "$model" --prompts-file "$run/prompts" --max-tokens 24 \
    > "$run/single.out"
if cmp -s "$run/cluster.out" "$run/single.out"; then
    echo "== the cluster's tokens equal a single engine's (hpd-run): yes"
else
    echo "== the cluster's tokens differ from hpd-run's" >&2
    exit 1
fi
awk '/"ttft_ms"/ {gsub(/,/, ""); t += $2; n++} /"cached_tokens"/ {gsub(/,/, ""); c += $2}
     END {printf "== mean TTFT %.1f ms over %d requests; %d prompt tokens served from the prefix cache\n", t / n, n, c}' \
    "$run/stats.json"
sleep 0.6 # one heartbeat, so the nodes report the final state
echo "== hpd-client status"
"${client[@]}" status
