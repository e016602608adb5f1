#!/usr/bin/env bash
# The coordinator at scale (docs/benchmarks.md, "The coordinator at
# scale"): hpd-coordinator in front of NODES simulated nodes (hpd-sim, a
# quarter prefill), pinned to one core with the nodes and the load on the
# other. Two runs, each on a fresh coordinator: REQUESTS as fast as a
# window of 1,024 open ones allows (the throughput), then Poisson arrivals
# at 80 % of that (the delay the coordinator adds at load). Every answer is
# checked token by token and by the nodes that served it. Prints each run's
# line from hpd-sim and the ratio of the requests routed per coordinator
# CPU second to issue 39's goal (20,000). A third run streams long answers
# (64 tokens at a 2 ms step) and prints the tokens the coordinator relays
# per CPU second; a fourth the same through two front doors (the decode
# nodes stream to them), printing the coordinator's CPU per request both
# ways and the tokens a door streams per CPU second; a fifth the first
# run's load through the HTTP API (ids in, token_ids out, checked alike).
#   bash bench/coordinator.sh [NODES] [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
nodes=${1:-1000}
requests=${2:-20000}
prefill=$((nodes / 4))
decode=$((nodes - prefill))
goal=20000
ulimit -n "$(ulimit -Hn)"
dir=$(mktemp -d)
coord=
cleanup() {
    [ -n "$coord" ] && kill "$coord" 2> /dev/null && wait "$coord" 2> /dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
printf 'bench-secret\n' > "$dir/token"
key=bench-client-key-0123456789abcdef
printf '%s bench\n' "$key" > "$dir/keys"
pin_coord=() pin_sim=()
if command -v taskset > /dev/null && [ "$(nproc)" -ge 2 ]; then
    pin_coord=(taskset -c 0)
    pin_sim=(taskset -c 1-$(($(nproc) - 1)))
fi

start_coordinator() { # extra hpd-coordinator flags
    rm -f "$dir/port"
    "${pin_coord[@]}" ./build/coordinator/hpd-coordinator --host 127.0.0.1 --port 0 \
        --port-file "$dir/port" --token-file "$dir/token" --client-keys-file "$dir/keys" \
        --max-requests 100000 --max-connections $((4 * nodes + 256)) --log-level warn "$@" \
        > "$dir/coordinator.log" 2>&1 &
    coord=$!
    for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
    [ -s "$dir/port" ] || { cat "$dir/coordinator.log"; exit 1; }
}

stop_coordinator() {
    kill "$coord"
    wait "$coord" || true
    coord=
}

run() { # extra hpd-sim flags
    start_coordinator
    "${pin_sim[@]}" ./build/sim/hpd-sim --coordinator "127.0.0.1:$(cat "$dir/port")" \
        --token-file "$dir/token" --client-key "$key" --prefill "$prefill" --decode "$decode" \
        --requests "$requests" --connections 8 --prompt-tokens 256 --max-tokens 8 \
        --prefixes 64 --prefix-tokens 128 --step-us 20000 --prefill-us-per-token 1 \
        --push-us-per-page 1 --coordinator-pid "$coord" "$@" | tee "$dir/run.txt"
    stop_coordinator
}

echo "== $nodes nodes ($prefill prefill, $decode decode), $requests requests of 256 prompt" \
     "and 8 new tokens: as fast as a window of 1024 allows"
run --window 1024
rate=$(sed -n 's/.*s: \([0-9]*\) requests\/s.*/\1/p' "$dir/run.txt")
per_cpu=$(sed -n 's/.*, \([0-9]*\) requests per CPU second.*/\1/p' "$dir/run.txt")
echo "== Poisson arrivals at 80 % of that: $((rate * 8 / 10)) a second"
run --window 100000 --rate $((rate * 8 / 10))
echo "== token relay: $((requests / 4)) requests of 64 new tokens, a decode step of 2 ms," \
     "a window of 1024: every token passes the coordinator (node -> coordinator -> client)"
run --window 1024 --requests $((requests / 4)) --max-tokens 64 --step-us 2000
tokens=$(sed -n 's/.*requests\/s, \([0-9]*\) tokens\/s.*/\1/p' "$dir/run.txt")
secs=$(sed -n 's/.* in \([0-9.]*\) s: .*/\1/p' "$dir/run.txt")
cpu=$(sed -n 's/^coordinator: \([0-9.]*\) CPU s for the load.*/\1/p' "$dir/run.txt")
awk -v t="$tokens" -v s="$secs" -v c="$cpu" 'BEGIN {
    printf "tokens relayed per coordinator CPU second: %d (%d tokens/s over %.2f CPU s)\n",
           t * s / c, t, c }'
relay_cpu_req=$(awk -v c="$cpu" -v r="$((requests / 4))" 'BEGIN { printf "%.1f", c * 1e6 / r }')
echo "== the same through 2 front doors (hpd-coordinator --scheduler, on the load's cores):" \
     "the decode nodes stream to the doors, the coordinator hears each answer's end"
start_coordinator
door_pids=() doors=()
for i in 1 2; do
    rm -f "$dir/door$i.port"
    "${pin_sim[@]}" ./build/coordinator/hpd-coordinator --host 127.0.0.1 --port 0 \
        --port-file "$dir/door$i.port" --token-file "$dir/token" \
        --client-keys-file "$dir/keys" --scheduler "127.0.0.1:$(cat "$dir/port")" \
        --max-requests 100000 --max-connections 4096 --log-level warn \
        > "$dir/door$i.log" 2>&1 &
    door_pids+=($!)
    for _ in $(seq 100); do [ -s "$dir/door$i.port" ] && break; sleep 0.1; done
    doors+=("127.0.0.1:$(cat "$dir/door$i.port")")
done
"${pin_sim[@]}" ./build/sim/hpd-sim --coordinator "127.0.0.1:$(cat "$dir/port")" \
    --token-file "$dir/token" --client-key "$key" --prefill "$prefill" --decode "$decode" \
    --requests $((requests / 4)) --connections 8 --prompt-tokens 256 --max-tokens 64 \
    --prefixes 64 --prefix-tokens 128 --step-us 2000 --prefill-us-per-token 1 \
    --push-us-per-page 1 --window 1024 --coordinator-pid "$coord" \
    --doors "$(IFS=,; echo "${doors[*]}")" --door-pids "$(IFS=,; echo "${door_pids[*]}")" |
    tee "$dir/run.txt"
kill "${door_pids[@]}"
wait "${door_pids[@]}" || true
stop_coordinator
dcpu=$(sed -n 's/^coordinator: \([0-9.]*\) CPU s for the load.*/\1/p' "$dir/run.txt")
dtokens=$(sed -n 's/^doors: .*, \([0-9]*\) tokens per door CPU second/\1/p' "$dir/run.txt")
awk -v c="$dcpu" -v r="$((requests / 4))" -v was="$relay_cpu_req" -v t="$dtokens" 'BEGIN {
    printf "coordinator CPU per request of 64 tokens: %.1f us through the doors, %.1f us " \
           "relaying (%.2fx); tokens per door CPU second: %d\n", c * 1e6 / r, was,
           was / (c * 1e6 / r), t }'
echo "== the first run's load through the HTTP API (completions of ids with" \
     "return_token_ids, 64 keep-alive connections: the HTTP guard takes 64 new ones at once): $((requests / 4)) requests"
./build/tools/hpd-mkmodel --out "$dir/model" --vocab 1024 --seed 3 > /dev/null
rm -f "$dir/http.port"
start_coordinator --model "$dir/model" --http-port 0 --http-port-file "$dir/http.port"
for _ in $(seq 100); do [ -s "$dir/http.port" ] && break; sleep 0.1; done
"${pin_sim[@]}" ./build/sim/hpd-sim --coordinator "127.0.0.1:$(cat "$dir/port")" \
    --token-file "$dir/token" --client-key "$key" --prefill "$prefill" --decode "$decode" \
    --requests $((requests / 4)) --connections 64 --prompt-tokens 256 --max-tokens 8 \
    --prefixes 64 --prefix-tokens 128 --step-us 20000 --prefill-us-per-token 1 \
    --push-us-per-page 1 --window 64 --vocab 1024 --coordinator-pid "$coord" \
    --http "127.0.0.1:$(cat "$dir/http.port")" | tee "$dir/run.txt"
stop_coordinator
http_cpu=$(sed -n 's/.*, \([0-9]*\) requests per CPU second.*/\1/p' "$dir/run.txt")
echo "requests per coordinator CPU second through HTTP: $http_cpu (msgpack: $per_cpu)"
awk -v a="$per_cpu" -v g="$goal" 'BEGIN {
    printf "requests routed per coordinator CPU second: %d; the goal %d; ratio %.3f\n",
           a, g, a / g }'
