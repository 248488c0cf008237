#!/usr/bin/env bash
# GPU checks of the collective CTA cap and maco.Context (issue 20, Level 2) on one GPU shared by
# the ranks through MPS, and the co-residency experiment on persistent_gpu_4's flaky fused test
# (the fused 4-rank test repeated as is and with MACO_COLL_MAX_CTAS). Run from the checkout's
# root on the GPU machine with gpu-bundle/ (scripts/gpu-bundle.sh + a cp312 wheel in
# gpu-bundle/whl). Logs in $OUT; summary last.
#   usage: bash scripts/gpu-context.sh      (STEPS="..." picks steps; REPEAT=n the experiment)
set -u
source scripts/gpu-common.sh
export PYTHONUNBUFFERED=1 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-15s}
run=$PWD/$B/tools/maco-run
if [ -d gpu-bundle/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    gpu-bundle/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/tests/python
fi
nvidia-smi -L
for s in ${STEPS:-cap py bench flake}; do
  case $s in
    cap) for n in 2 4; do step cap_$n 120 "$run" -n $n --timeout 110 "$B/tests/test_gpu_mp" \
        --gtest_filter='*MaxCtas*'; done
      step cap_2x2 120 "$run" -n 4 --simulate-nodes 2 --timeout 110 "$B/tests/test_gpu_mp" \
        --gtest_filter='*MaxCtas*' ;;
    py) for n in 1 2; do step context_$n 150 "$run" -n $n --timeout 140 python3 \
        tests/python/gpu_context.py; done ;;
    bench) for n in 1 2; do step bench_context_$n 150 "$run" -n $n --timeout 140 python3 \
        tests/python/bench_context.py 4096 16; done ;;
    flake) for i in $(seq 1 "${REPEAT:-5}"); do
        step flake_base_$i 100 "$run" -n 4 --timeout 95 "$B/tests/test_persistent_gpu" \
          --gtest_filter='*FusedGemmAllreduce*'
        step flake_cap16_$i 100 env MACO_COLL_MAX_CTAS=16 "$run" -n 4 --timeout 95 \
          "$B/tests/test_persistent_gpu" --gtest_filter='*FusedGemmAllreduce*'
      done ;;
  esac
done
for f in "$OUT"/context_*.txt "$OUT"/bench_context_*.txt; do
  [ -f "$f" ] && { echo "--- $(basename "$f")"; grep -E "PASS|FAIL|rank .*green|Traceback|rror|hidden" "$f" | head -12; }
done
for f in "$OUT"/flake_*.txt; do
  [ -f "$f" ] && grep -q "FAILED\|timed out" "$f" && { echo "--- $(basename "$f")"; grep -E "timed out|FAILED|waited" "$f" | head -4; }
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
