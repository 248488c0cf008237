#!/usr/bin/env bash
# Runs on the lent H100 (bundle of branch gemm2, scripts in /work/gemm2-tools): unpacks the new
# build and main's baseline, a smoke test of the new GEMM tiles, then bench_gemm_tile of both
# (same process order each time), then the persistent-kernel GPU tests. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
W=/tmp/gb; rm -rf $W; mkdir -p $W; tar xzf new.tgz -C $W; tar xzf base.tgz -C $W
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; } > "$OUT/machine.txt" 2>&1
S=$OUT/summary.txt; : > $S
T=$OUT/tests.txt; : > $T
t() { # name timeout libdir cmd... : a test run appended to tests.txt
  local name=$1 to=$2 lib=$3; shift 3
  local t0=$(date +%s)
  echo "=================== $name: $*" >> $T
  LD_LIBRARY_PATH=$lib timeout $to "$@" >> $T 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s $(grep -a -E '^\[[0-9]\] \[  (PASSED|FAILED)' $T | tail -2 | tr '\n' ' ')" | tee -a $S
  return $rc
}
b() { # name timeout libdir cmd... : a bench run into its own file
  local name=$1 to=$2 lib=$3; shift 3
  local t0=$(date +%s)
  LD_LIBRARY_PATH=$lib timeout $to "$@" > $OUT/$name.txt 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a $S
}
N=$W/new; BA=$W/base
t smoke-gemm-1 50 $N $N/maco-run -n 1 --timeout 45 $N/test_persistent_gpu --gtest_filter='*Gemm*'
smoke=$?
if [ $smoke -ne 124 ]; then
  b bench-base 60 $BA $BA/bench_gemm_tile --iters 50 --tiles gmma --profile
  b bench-new 90 $N $N/bench_gemm_tile --iters 50 --tiles gmma --profile
  b bench-drain 60 $N env GEMM2_EXPERIMENT_DRAIN=1 $N/bench_gemm_tile --iters 50 --tiles gmma --tile-n 128,256
  b bench-new2 60 $N $N/bench_gemm_tile --iters 50 --tiles gmma
  b bench-base2 40 $BA $BA/bench_gemm_tile --iters 50 --tiles gmma
  t suite-1 90 $N $N/maco-run -n 1 --timeout 85 $N/test_persistent_gpu --gtest_filter='-*NeverGetsItsSignal*'
  t suite-2 90 $N $N/maco-run -n 2 --mps on --timeout 85 $N/test_persistent_gpu --gtest_filter='-*NeverGetsItsSignal*'
  t cublasdx-gemm-1 60 $N env MACO_GEMM_TILE=cublasdx $N/maco-run -n 1 --timeout 55 $N/test_persistent_gpu --gtest_filter='*Gemm*'
  t wide-fused-1 40 $N env MACO_GEMM_TILE_WIDTH=256 $N/maco-run -n 1 --timeout 35 $N/test_persistent_gpu --gtest_filter='*Fused*'
  t wide-fused-2 50 $N env MACO_GEMM_TILE_WIDTH=256 $N/maco-run -n 2 --mps on --timeout 45 $N/test_persistent_gpu --gtest_filter='*Fused*'
  t timeout-1 40 $N env MACO_DEVICE_TIMEOUT=1s $N/maco-run -n 1 --timeout 35 $N/test_persistent_gpu --gtest_filter='*NeverGetsItsSignal*'
else
  b bench-new 40 $N $N/bench_gemm_tile --iters 5 --tiles gmma --tile-n 128
fi
echo "== $(head -1 $OUT/machine.txt)"
for f in bench-base bench-new bench-drain bench-new2 bench-base2; do
  [ -f $OUT/$f.txt ] && { echo "-- $f"; grep -a -v "^#" $OUT/$f.txt | cut -c1-230; }
done
echo "-- failures:"; grep -a -E "Failure|FAILED  \]|Expected|Which is" $T | sort | uniq -c | head -20
cat $S
