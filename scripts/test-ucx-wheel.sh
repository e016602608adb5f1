#!/usr/bin/env bash
# The data plane's tests against a second UCX: NVIDIA's UCX 1.22 from PyPI
# (libucx-cu13: headers, pkg-config files, the CUDA transports), beside the
# Debian 12 UCX 1.13 the rest of the suite uses. Builds into build-ucxw (or
# $BUILD_DIR) without CUDA kernels or benchmarks, found through
# PKG_CONFIG_PATH as any other UCX would be, and runs the transport tests
# and the cluster's partition tests on it.
#
#   bash scripts/test-ucx-wheel.sh
#
# Skips (exit 0, saying why) where pip cannot fetch the wheel;
# HPD_REQUIRE_UCX_WHEEL=1 (CI) makes that a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build-ucxw}
version=${UCX_WHEEL_VERSION:-1.22.0}

skip() {
    if [ "${HPD_REQUIRE_UCX_WHEEL:-0}" = 1 ]; then
        echo "ucx wheel: $*" >&2
        exit 1
    fi
    echo "ucx wheel: skipped: $*"
    exit 0
}

mkdir -p "$dir"
ucx=$(cd "$dir" && pwd)/ucx
if [ ! -f "$ucx/.version-$version" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --no-deps --only-binary=:all: "libucx-cu13==$version" -d "$tmp" \
        > "$tmp/log" 2>&1 || skip "pip could not fetch libucx-cu13==$version: $(tail -1 "$tmp/log")"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$(ls "$tmp"/*.whl | head -1)" "$tmp/x"
    rm -rf "$ucx"
    mv "$tmp/x/libucx" "$ucx"
    # a wheel holds no symbolic links: every soname is a full copy or missing
    while IFS= read -r f; do
        base=${f%.so.*}.so
        major=$(basename "$f" | sed -E 's/.*[.]so[.]([0-9]+)[.].*/\1/')
        [ -e "$base.$major" ] || ln -s "$(basename "$f")" "$base.$major"
        [ -e "$base" ] || ln -s "$(basename "$f")" "$base"
    done < <(find "$ucx/lib" -name 'lib*.so.*.*.*')
    # its pkg-config files name the prefix it was built in
    sed -i -E "s#^prefix *=.*#prefix = $ucx#" "$ucx"/lib/pkgconfig/*.pc
    touch "$ucx/.version-$version"
fi
export PKG_CONFIG_PATH=$ucx/lib/pkgconfig
export LD_LIBRARY_PATH=$ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$ucx/lib/ucx
got=$(pkg-config --modversion ucx)
case $got in "${version%.*}"*) ;; *) echo "ucx wheel: pkg-config found UCX $got, not $version" >&2; exit 1 ;; esac

# no CUDA kernels (nvcc alone would double the build) and no benchmarks
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DHPD_BUILD_BENCH=OFF \
    -DHPD_NVCC=HPD_NVCC-NOTFOUND > "$dir/build.log" 2>&1 || { cat "$dir/build.log"; exit 1; }
# not test_cluster: on 1.22 its test_failover aborted a decode node inside
# UCX once in five runs (ucp_request_try_send: "Fatal: unexpected error:
# Endpoint timeout" after a peer was killed), a fault of UCX's own not yet
# worked around (docs/testing.md)
tests=(test_xfer test_xfer_local)
if ! cmake --build "$dir" -j"${JOBS:-2}" >> "$dir/build.log" 2>&1; then
    cat "$dir/build.log"
    exit 1
fi
# the tests must run on this UCX, not on the system's
# (ldd's whole output first: `ldd | grep -q` under pipefail fails whenever
# grep exits on its match before ldd has written its last line, SIGPIPE)
linked=$(ldd "$dir/tests/test_xfer_local")
grep -q "$ucx/lib/libucp" <<< "$linked" ||
    { echo "ucx wheel: test_xfer_local is not linked to $ucx:" >&2; echo "$linked" >&2; exit 1; }
echo "ucx wheel: UCX $got from $ucx"
(cd "$dir" && ctest -R "^($(IFS='|'; echo "${tests[*]}"))\$" --output-on-failure)
# test_partition's slow, lossy links only: on 1.22 a prefill node that
# closed its endpoint to a decode node it could no longer reach (test_cut_path,
# test_link_down) crashed inside UCX's tcp transport 5 times in 19 runs
# under load (a use after free of the discarded lane's tcp_ep in
# uct_tcp_iface_handle_events; docs/testing.md); 0 in 12 on 1.13
(cd "$dir" && HPD_TEST_FILTER='*lossy*' ctest -R '^test_partition$' --output-on-failure)
