#!/usr/bin/env bash
# Run 3 on the lent H100 (bundle of branch gemm2 at commit 67e5a90, main's baseline at 11e8ff4):
# bench_gemm_tile of main and of gemm2 alternated twice (100 timed calls each), gemm2's profile,
# the cuBLASDx tiles' check, the plan on tensor-parallel shapes; then the persistent-kernel GPU
# tests (1 and 2 ranks, cuBLASDx, wide fused tiles, the lost signal) and Python's
# gpu_persistent.py at 1 and 2 ranks. Logs in $OUT, summary last.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s} PYTHONUNBUFFERED=1
W=/tmp/gb; rm -rf $W; mkdir -p $W; tar xzf new.tgz -C $W; tar xzf base.tgz -C $W
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; } > "$OUT/machine.txt" 2>&1
S=$OUT/summary.txt; : > $S
run() { # file name timeout libdir cmd... : appended to $OUT/file.txt
  local file=$1 name=$2 to=$3 lib=$4; shift 4
  local t0=$(date +%s)
  echo "=================== $name: $*" >> $OUT/$file.txt
  LD_LIBRARY_PATH=$lib timeout $to "$@" >> $OUT/$file.txt 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a $S
}
N=$W/new; BA=$W/base
for i in 1 2; do
  run bench base-$i 60 $BA $BA/bench_gemm_tile --iters 100 --tiles gmma
  run bench new-$i 90 $N $N/bench_gemm_tile --iters 100 --tiles gmma --tile-n 128,256,plan
done
run bench new-profile 60 $N $N/bench_gemm_tile --iters 50 --tiles gmma --tile-n 256,plan --profile
run extra cublasdx 120 $N $N/bench_gemm_tile --iters 5 --tiles cublasdx --tile-n 128,plan
run extra tp-shapes 90 $N $N/bench_gemm_tile --iters 50 --tiles gmma --tile-n 128,256,plan --shapes 128x8192x2048,1024x8192x2048,8192x8192x2048,4096x2048x8192,32768x2048x8192
T="test_persistent_gpu --gtest_filter=-*NeverGetsItsSignal*"
run tests suite-1 90 $N $N/maco-run -n 1 --timeout 85 $N/test_persistent_gpu --gtest_filter='-*NeverGetsItsSignal*'
run tests suite-2 90 $N $N/maco-run -n 2 --mps on --timeout 85 $N/test_persistent_gpu --gtest_filter='-*NeverGetsItsSignal*'
run tests cublasdx-1 60 $N env MACO_GEMM_TILE=cublasdx $N/maco-run -n 1 --timeout 55 $N/test_persistent_gpu --gtest_filter='*Gemm*'
run tests cublasdx-wide-2 60 $N env MACO_GEMM_TILE=cublasdx MACO_GEMM_TILE_WIDTH=256 $N/maco-run -n 2 --mps on --timeout 55 $N/test_persistent_gpu --gtest_filter='*Gemm*'
run tests wide-fused-1 40 $N env MACO_GEMM_TILE_WIDTH=256 $N/maco-run -n 1 --timeout 35 $N/test_persistent_gpu --gtest_filter='*Fused*'
run tests wide-fused-2 50 $N env MACO_GEMM_TILE_WIDTH=256 $N/maco-run -n 2 --mps on --timeout 45 $N/test_persistent_gpu --gtest_filter='*Fused*'
run tests timeout-1 40 $N env MACO_DEVICE_TIMEOUT=1s $N/maco-run -n 1 --timeout 35 $N/test_persistent_gpu --gtest_filter='*NeverGetsItsSignal*'
export PYTHONPATH=$N/py:$N/pytests
run python py-1 120 $N $N/maco-run -n 1 --timeout 110 python3 $N/pytests/gpu_persistent.py
run python py-2 150 $N $N/maco-run -n 2 --mps on --timeout 140 python3 $N/pytests/gpu_persistent.py
echo "== $(head -1 $OUT/machine.txt)"
grep -a -E "^=====|^ +[0-9]+ |profile|WRONG|NaN|matches" $OUT/bench.txt | cut -c1-200
grep -a -E "^=====|^ +[0-9]+ |WRONG|NaN|matches" $OUT/extra.txt | cut -c1-160
echo "-- tests"; grep -a -E "^=====|\[  PASSED|\[  FAILED|\[  SKIPPED \] [A-Z]|Failure" $OUT/tests.txt | sort | uniq -c | cut -c1-160 | head -40
echo "-- python"; grep -a -E "^=====|PASS|FAIL|SKIP|Traceback|Error" $OUT/python.txt | cut -c1-200 | head -20
cat $S
