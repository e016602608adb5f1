# The CLI tests' checks (sourced): check NAME CONDITION... counts a pass or
# prints FAIL: NAME; finish prints the counts and fails if any check did.
fails=0
pass=0

check() {
    local name=$1
    shift
    if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}

finish() {
    echo "$pass passed, $fails failed"
    test $fails -eq 0
}
