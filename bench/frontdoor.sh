#!/usr/bin/env bash
# What a front door takes off the scheduler (docs/benchmarks.md, "Front
# doors"): a real cluster on the tiny model (a scheduler, a prefill node,
# two decode nodes, one front door), the same REQUESTS prompts sent
# straight to the scheduler and through the door, with answers of SHORT
# and LONG tokens (ignore_eos). Prints the scheduler's CPU time per
# request in each case (from /proc: its user + system time across the
# run), the ratio long / short (1.0: the scheduler's cost does not grow
# with the answer), the door's CPU time per request, each run's wall time
# and the scheduler's CPU time a second when idle (what a longer run costs
# it without any request). Every answer through the door is compared with
# the scheduler's own.
#   bash bench/frontdoor.sh [REQUESTS] [SHORT] [LONG]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > /dev/null
requests=${1:-512}
short=${2:-16}
long=${3:-256}
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
    wait 2> /dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
b=./build
$b/tools/hpd-mkmodel --out "$dir/model" --hidden 128 --layers 4 --full-interval 2 \
    --intermediate 256 --vocab 1024 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 \
    --lin-v-heads 4 --lin-k-dim 32 --lin-v-dim 32 --seed 9 > /dev/null
printf 'bench-secret\n' > "$dir/token"
key=bench-client-key-0123456789abcdef
printf '%s bench\n' "$key" > "$dir/keys"
printf '%s\n' "$key" > "$dir/key"
for i in $(seq "$requests"); do
    seq -s, $((i % 97 + 1)) $((i % 97 + 40))
done > "$dir/prompts"

wait_file() { for _ in $(seq 300); do [ -s "$1" ] && return; sleep 0.1; done; exit 1; }
$b/coordinator/hpd-coordinator --host 127.0.0.1 --port 0 --port-file "$dir/s.port" \
    --token-file "$dir/token" --client-keys-file "$dir/keys" --max-requests 4096 \
    --log-level warn > "$dir/scheduler.log" 2>&1 &
sched=$!
pids+=("$sched")
wait_file "$dir/s.port"
saddr=127.0.0.1:$(cat "$dir/s.port")
for node in prefill:p0 decode:d0 decode:d1; do
    $b/${node%%:*}_node/hpd-${node%%:*} --coordinator "$saddr" --token-file "$dir/token" \
        --model "$dir/model" --name "${node#*:}" --threads 1 --max-context 4096 \
        --max-batch 32 --log-level warn > "$dir/${node#*:}.log" 2>&1 &
    pids+=($!)
done
$b/coordinator/hpd-coordinator --host 127.0.0.1 --port 0 --port-file "$dir/d.port" \
    --token-file "$dir/token" --client-keys-file "$dir/keys" --scheduler "$saddr" \
    --max-requests 4096 --log-level warn > "$dir/door.log" 2>&1 &
door=$!
pids+=("$door")
wait_file "$dir/d.port"
daddr=127.0.0.1:$(cat "$dir/d.port")

cpu_ms() { # a process's user + system time in ms
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%d\n", ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
}
# a run: ADDRESS TOKENS NAME -> the answers in $dir/NAME, CPU ms per request
run() {
    local s0 d0 s1 d1 t0
    s0=$(cpu_ms "$sched")
    d0=$(cpu_ms "$door")
    t0=$(date +%s%N)
    $b/client/hpd-client --coordinator "$1" --token-file "$dir/key" generate \
        --prompts-file "$dir/prompts" --max-tokens "$2" --ignore-eos --temperature 0 \
        --concurrency 32 > "$dir/$3"
    s1=$(cpu_ms "$sched")
    d1=$(cpu_ms "$door")
    echo "$(((s1 - s0) * 1000 / requests)) $(((d1 - d0) * 1000 / requests))" \
        "$((($(date +%s%N) - t0) / 1000000))"
}
# warm up (the door waits for decode nodes), then each case
for _ in $(seq 100); do
    $b/client/hpd-client --coordinator "$daddr" --token-file "$dir/key" generate \
        --prompt-ids 1,2,3 --max-tokens 2 > /dev/null 2>&1 && break
    sleep 0.1
done
i0=$(cpu_ms "$sched")
sleep 5
idle=$((($(cpu_ms "$sched") - i0) / 5))
read -r ds _ dsw < <(run "$saddr" "$short" direct-short)
read -r dl _ dlw < <(run "$saddr" "$long" direct-long)
read -r fs fds fsw < <(run "$daddr" "$short" door-short)
read -r fl fdl flw < <(run "$daddr" "$long" door-long)
cmp -s "$dir/direct-short" "$dir/door-short" && cmp -s "$dir/direct-long" "$dir/door-long" ||
    { echo "answers through the door differ from the scheduler's"; exit 1; }
echo "scheduler CPU per request (us), $requests requests, answers of $short / $long tokens:"
echo "  straight to the scheduler: $ds / $dl  (long / short $(awk -v a="$dl" -v b="$ds" 'BEGIN { printf "%.2f", a / b }'))"
echo "  through a front door:      $fs / $fl  (long / short $(awk -v a="$fl" -v b="$fs" 'BEGIN { printf "%.2f", a / b }'))"
echo "  the door's own:            $fds / $fdl"
echo "runs took $dsw / $dlw ms straight, $fsw / $flw ms through the door; the scheduler" \
    "idle (heartbeats, ticks) uses $idle ms of CPU a second"
echo "every answer through the door equals the scheduler's own"
