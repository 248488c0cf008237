#!/usr/bin/env bash
# Configures and builds MACO into ${MACO_BUILD_DIR:-build}. Extra CMake arguments come from
# MACO_CMAKE_ARGS; CUDAARCHS (e.g. 90) picks the CUDA architectures, otherwise the GPU of
# this machine or, without one, Ampere and Hopper.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MACO_BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${MACO_BUILD_TYPE:-Release} ${MACO_CMAKE_ARGS:-}
cmake --build "$build" --parallel
