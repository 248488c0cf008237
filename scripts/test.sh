#!/usr/bin/env bash
# Install, build, run the whole test suite. Tests that need GPUs skip with the reason when
# the machine has too few.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure "$@"
