#!/usr/bin/env bash
# Runs on a lent one-GPU machine from a bundle made by hand (a copy of build/ with libmaco,
# libjansson, maco-run, maco-perf, maco-plan, test_plan_gpu and ctest's files, plus
# algorithms/plans): the bundle is linked to the path the build was made at, so ctest's and
# the rpath's absolute paths resolve. Runs the plan executor's GPU tests, the 2 nodes x 2
# plans first (port channels, 4 ranks as 2 simulated nodes under MPS). Logs go to $OUT.
#   usage: bash gpu-bundle-plan/run.sh   (BUILT_AT: where the build was made)
set -uo pipefail
cd "$(dirname "$0")"
root=$PWD
built_at=${BUILT_AT:-/work/wt-plan2}
mkdir -p "$(dirname "$built_at")" && ln -sfn "$root" "$built_at"
OUT=${OUT:-/tmp/maco-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > "$OUT/machine.txt" 2>&1
cd "$built_at/build"
for tl in gpu_plan_2x2:170 gpu_plan_algo_2x2:90 gpu_plan_2:25 gpu_plan_4:25 gpu_plan_algo_2:25 \
          gpu_plan_algo_4:25; do
  t=${tl%%:*}
  t0=$(date +%s)
  timeout "${tl##*:}" ctest -R "^$t\$" -V > "$OUT/$t.txt" 2>&1
  rc=$?
  echo "$t rc=$rc $(( $(date +%s) - t0 ))s $(grep -E 'tests passed|tests failed' "$OUT/$t.txt" | tail -1)"
done
echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"
