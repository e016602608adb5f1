#!/usr/bin/env bash
# The layers hold at link time: the client and the coordinator speak RPC
# and nothing else, so neither links UCX, CUDA, cuBLAS, NCCL nor OpenMP
# (the kernels). A change that pulls the data plane or the kernels into
# them fails here, naming the library.
set -u
fails=0
for bin in "$@"; do
    bad=$(ldd "$bin" | grep -E 'libuc[pst]|libcuda|libcudart|libcublas|libnccl|libgomp' || true)
    if [ -n "$bad" ]; then
        echo "FAIL: $(basename "$bin") links what it must not:"
        echo "$bad"
        fails=$((fails + 1))
    fi
done
ldd "$1" >/dev/null || { echo "FAIL: cannot ldd $1"; exit 1; }
[ "$fails" -eq 0 ] && echo "ok: $# binaries link RPC only"
exit "$fails"
