#!/usr/bin/env bash
# Configures and builds into build/ (or $BUILD_DIR) with the given extra CMake
# arguments. The full build log is in $BUILD_DIR/build.log; it is printed
# when the build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" > "$dir/build.log" 2>&1 ||
    { cat "$dir/build.log"; exit 1; }
if ! cmake --build "$dir" -j"${JOBS:-2}" >> "$dir/build.log" 2>&1; then
    cat "$dir/build.log"
    exit 1
fi
grep -E "warning:" "$dir/build.log" || true
echo "build: $dir ok"
