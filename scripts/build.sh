#!/usr/bin/env bash
# Configures and builds MACO into ${BUILD_DIR:-build}.
#   usage: scripts/build.sh [TARGET...]
# With targets (e.g. maco-perf maco-run), builds only those and what they need; without, the
# whole tree (library, tools, tests, benchmarks). Extra CMake arguments come from CMAKE_ARGS;
# CUDAARCHS (e.g. 90) picks the CUDA architectures, otherwise the GPU of this machine or,
# without one, Hopper (90, with PTX).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-}
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "${targets[@]}"
