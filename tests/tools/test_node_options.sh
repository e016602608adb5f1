#!/usr/bin/env bash
# The node daemons' command lines as a user types them: an option of the
# other role, a bad value, a missing required option each stop the node
# with status 2 and a message naming the option, before it loads anything.
set -u
prefill=$1
decode=$2
fails=0
pass=0
expect() { # expect NAME WANT_TEXT COMMAND...
    local name=$1 want=$2
    shift 2
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -eq 2 ] && grep -qF -- "$want" <<<"$out"; then
        pass=$((pass + 1))
    else
        echo "FAIL: $name: status $rc, output: $out"
        fails=$((fails + 1))
    fi
}
c="--coordinator 127.0.0.1:1 --model /nonexistent"
expect "decode with a prefill option" "--staging-mb is an option of prefill nodes, not of decode nodes" \
    "$decode" $c --staging-mb 4
expect "decode with --xfer-deadline-ms" "--xfer-deadline-ms is an option of prefill nodes" \
    "$decode" $c --xfer-deadline-ms 10
expect "decode with --no-prefix-cache" "--no-prefix-cache is an option of prefill nodes" \
    "$decode" $c --no-prefix-cache
expect "prefill with a decode option" "--reserve-timeout-ms is an option of decode nodes, not of prefill nodes" \
    "$prefill" $c --reserve-timeout-ms 5
expect "a bad value" "--xfer-deadline-ms: 'soon' is invalid (expected an integer from 0 to 3600000)" \
    "$prefill" $c --xfer-deadline-ms soon
expect "no coordinator" "--coordinator is required" "$prefill" --model /x
expect "no model" "--model is required" "$decode" --coordinator 127.0.0.1:1
expect "a bad endpoint" "--coordinator: 'nowhere' is invalid (expected HOST:PORT)" "$decode" --coordinator nowhere --model /x
expect "a bad one of several" "(expected HOST:PORT,HOST:PORT,...: 'nowhere' is none)" "$decode" --coordinator 127.0.0.1:7000,nowhere --model /x
expect "too many" "(expected at most 8 coordinators, HOST:PORT each)" "$decode" --coordinator a:1,a:2,a:3,a:4,a:5,a:6,a:7,a:8,a:9 --model /x
expect "a coordinator option" "--lease-ms is an option of the coordinator, not of prefill nodes" "$prefill" $c --lease-ms 100
echo "$pass passed, $fails failed"
exit "$fails"
