#!/usr/bin/env bash
# Install, build, run the whole test suite. Tests that need GPUs skip with the reason when
# the machine has too few; the reasons are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
build=${BUILD_DIR:-build}
rc=0
ctest --test-dir "$build" --output-on-failure "$@" || rc=$?
# ctest keeps every test's output; show why tests skipped (the lines the tests print, not
# ctest's record of their command lines, which also contain "SKIP:").
grep -h -E '^(\[[0-9]+\] )?SKIP:' "$build/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true
exit $rc
