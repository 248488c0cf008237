#!/usr/bin/env bash
# Runs on a lent one-GPU machine over a carried build (scripts/gpu-bundle.sh): the whole GPU
# suite of ctest (without python_gpu, which needs the Python environment), then the
# cross-node p2p and group tests with one rank per simulated node. Logs go to $OUT; a short
# summary is printed last.
#   usage: scripts/gpu-verify-merged.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-common.sh
t0=$(date +%s)
timeout 420 ctest --test-dir "$B" -L gpu -E python_gpu --output-on-failure --timeout 200 \
  > "$OUT/ctest-gpu.txt" 2>&1
echo "ctest -L gpu: rc=$? $(( $(date +%s) - t0 ))s"
export MACO_DEVICE_TIMEOUT=10s
R="$B/tools/maco-run"
timeout 100 "$R" -n 2 --simulate-nodes 2 --timeout 95 "$B/tests/test_gpu_mp" \
  --gtest_filter='P2P*' > "$OUT/p2p-2x1.txt" 2>&1
echo "p2p 2x1: rc=$? $(grep -E 'PASSED|FAILED TEST' "$OUT/p2p-2x1.txt" | tail -1)"
timeout 60 "$R" -n 2 --simulate-nodes 2 --timeout 55 "$B/tests/test_group_mp" \
  > "$OUT/group-2x1.txt" 2>&1
echo "group 2x1: rc=$? $(grep -E 'PASSED|FAILED TEST' "$OUT/group-2x1.txt" | tail -1)"
echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"
grep -E "Test +#|tests passed|Total Test" "$OUT/ctest-gpu.txt"
