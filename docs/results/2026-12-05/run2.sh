#!/usr/bin/env bash
# One H200, the persistent branch's build with MathDx (d8dfb1d): the persistent runtime's GPU
# tests (the copy-engine mode at 1, 2, 4 ranks under MPS, dead peers), bench_gemm_tile over
# bench_fused's shape sets against cuBLAS (whole GPU and SM-limited), bench_persistent, and
# compute-sanitizer on bench_persistent (an illegal access seen in its runtime-costs part).
set -uo pipefail
. scripts/gpu-common.sh
export MACO_DEVICE_TIMEOUT=20s TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0
T0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv; } > $OUT/machine.txt 2>&1
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $OUT/$n.txt 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/summary.txt; }
s ctest_pk 120 ctest --test-dir $B -R 'persistent_gpu' --output-on-failure --timeout 150
GT="--sets tp,llama70b --world 4 --sizes 128,1024,4096,8192 --out bf16,fp32 --tiles gmma --tile-n 256,plan --iters 10"
s gemm 130 $B/tests/bench_gemm_tile $GT
left=$(( 330 - ($(date +%s) - T0) ))
[ $left -gt 20 ] && s sanitizer $left compute-sanitizer --tool memcheck --print-limit 5 $B/tests/bench_persistent --tasks 100 --iters 1
grep -E "Test +#|tests passed" $OUT/ctest_pk.txt | cut -c1-100
grep -E "^\[0\] \[  FAILED" $OUT/ctest_pk.txt | sort -u | head
grep -v "^  profile" $OUT/gemm.txt | cut -c1-132 | head -n 75
grep -m 12 -E "Invalid|at 0x|by thread|ERROR SUMMARY|illegal|Address" $OUT/sanitizer.txt
cat $OUT/summary.txt
