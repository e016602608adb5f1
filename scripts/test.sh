#!/usr/bin/env bash
# Builds and runs the whole test suite twice: a release build, then a build
# with AddressSanitizer and UndefinedBehaviorSanitizer. Fails on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== release build"
BUILD_DIR=build bash scripts/build.sh
(cd build && ctest -j2 --output-on-failure)

echo "== asan + ubsan build"
BUILD_DIR=build-san BUILD_TYPE=Debug bash scripts/build.sh -DHPD_ASAN=ON -DHPD_UBSAN=ON
(cd build-san && ASAN_OPTIONS=detect_leaks=1 ctest -j2 --output-on-failure)

echo "== the data plane on a second UCX (1.22, PyPI's libucx-cu13)"
bash scripts/test-ucx-wheel.sh
