#!/usr/bin/env bash
# Runs on the lent H100 (bundle of branch gemm-tma): the persistent-kernel tests (GEMM/fused
# with MACO_GEMM_TILE=gmma at 1 and 2 ranks, the whole suite with the default tile at 1 rank),
# then bench_gemm_tile twice (cuBLAS vs the persistent kernel's tiles; per-task profile).
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
summ() { grep -E "\[  PASSED|\[  FAILED|\[  SKIPPED \] [A-Z]|Failure" "$1" | sort | uniq | head -12; }
t() { # name timeout env... -- maco-run args
  local name=$1 to=$2; shift 2
  echo "== $name"
  timeout "$to" env "${@}" > "$OUT/$name.txt" 2>&1
  echo "rc=$?"; summ "$OUT/$name.txt"
}
t test-gmma-1 60 MACO_GEMM_TILE=gmma ./maco-run -n 1 --timeout 55 ./test_persistent_gpu --gtest_filter='*Gemm*'
t test-default-1 80 ./maco-run -n 1 --timeout 75 ./test_persistent_gpu --gtest_filter='-*NeverGetsItsSignal*'
t test-gmma-2 50 MACO_GEMM_TILE=gmma ./maco-run -n 2 --timeout 45 ./test_persistent_gpu --gtest_filter='*Gemm*'
echo "== bench 1"
timeout 60 ./bench_gemm_tile --iters 50 --tiles cublasdx,gmma --profile > "$OUT/bench1.txt" 2>&1
echo "rc=$?"; grep -v "^#" "$OUT/bench1.txt"
echo "== bench 2"
timeout 40 ./bench_gemm_tile --iters 50 --tiles gmma > "$OUT/bench2.txt" 2>&1
echo "rc=$?"; grep -v "^#" "$OUT/bench2.txt"
