#!/usr/bin/env bash
# Runs on a lent one-GPU machine over a carried build (scripts/gpu-bundle.sh plus the NCCL
# library's files under gpu-bundle/build/src/nccl and build/tests/nccl): ctest's whole GPU
# suite except python_gpu (scripts/gpu-python.sh runs that, it needs the package's wheel),
# then the cross-node p2p and group tests with one rank per simulated node. Logs in $OUT;
# a summary last.
#   usage: bash scripts/gpu-verify-final.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-common.sh
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 480 ctest --test-dir "$B" -L gpu -E python_gpu --output-on-failure --timeout 200 \
  > "$OUT/ctest-gpu.txt" 2>&1
echo "ctest -L gpu: rc=$? $(( $(date +%s) - t0 ))s"
export MACO_DEVICE_TIMEOUT=10s
R="$B/tools/maco-run"
step p2p-2x1 60 "$R" -n 2 --simulate-nodes 2 --timeout 55 "$B/tests/test_gpu_mp" --gtest_filter='P2P*'
step group-2x1 40 "$R" -n 2 --simulate-nodes 2 --timeout 35 "$B/tests/test_group_mp"
echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"
grep -E "Test +#|tests passed|Total Test" "$OUT/ctest-gpu.txt"
printf '%s\n' "${summary[@]}"
