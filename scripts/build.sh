#!/usr/bin/env bash
# Configures and builds MACO into ${BUILD_DIR:-build}. Extra CMake arguments come from
# CMAKE_ARGS; CUDAARCHS (e.g. 90) picks the CUDA architectures, otherwise the GPU of
# this machine or, without one, Hopper (90, with PTX).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-}
cmake --build "$build" --parallel
