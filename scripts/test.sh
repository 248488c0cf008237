#!/usr/bin/env bash
# Install, build, run the whole test suite. Tests that need GPUs skip with the reason when
# the machine has too few; the reasons are printed at the end, one line per distinct reason
# (scripts/skip_summary.py). Arguments go to ctest (e.g. -L cpu, -R unit).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
build=${BUILD_DIR:-build}
rc=0
junit="$(cd "$build" && pwd)/Testing/ctest-junit.xml"
rm -f "$junit"
ctest --test-dir "$build" --output-on-failure --output-junit "$junit" "$@" || rc=$?
[ -f "$junit" ] && python3 scripts/skip_summary.py "$junit" || true
exit $rc
