#!/usr/bin/env bash
# Runs on a lent GPU machine over a build made elsewhere (build/, or gpu-bundle/build): the
# persistent-kernel runtime's GPU tests (1 rank, 2 ranks sharing the GPU, the lost signal),
# then its benchmarks. Logs go to $OUT; a short summary is printed last.
#   usage: scripts/gpu-persist.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
. scripts/gpu-common.sh
{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv; } \
  > "$OUT/machine.txt" 2>&1
export TEST_PERSIST_TRACE_DIR=$OUT
step persist-tests "${TEST_TIMEOUT:-150}" ctest --test-dir "$B" -R '^persistent_gpu' -V
step bench-persistent "${BENCH_TIMEOUT:-90}" "$B/tests/bench_persistent"
if [ -x "$B/tests/bench_gemm_tile" ]; then
  step bench-gemm 60 "$B/tests/bench_gemm_tile"
fi
echo "== $(head -1 "$OUT/machine.txt")"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Passed|\*\*\*" "$OUT/persist-tests.txt" | tail -12
grep -E "^ *[0-9]|WRONG|0 wrong|vs |tasks of" "$OUT/bench-persistent.txt" | head -30
[ -f "$OUT/bench-gemm.txt" ] && tail -15 "$OUT/bench-gemm.txt"
printf '%s\n' "${summary[@]}"
