#!/usr/bin/env bash
# Call 1 (2026-12-05, one H200): the carried build of main at 38443ee, built without MathDx
# (so without GEMM tiles), and /tmp/before (libmaco and two benches of main at 4956ec2).
set -uo pipefail
. scripts/gpu-common.sh
export MACO_DEVICE_TIMEOUT=20s TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s)
tar xzf gpu-bundle/before.tgz -C /tmp
R=$B/tools/maco-run
{ nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv; } > $OUT/machine.txt 2>&1
GT="--sets tp,llama70b --world 4 --sizes 128,1024,4096,8192 --out bf16,fp32 --tiles gmma --tile-n 256,plan --iters 20"
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $OUT/$n.txt 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s" | tee -a $OUT/summary.txt; }
s gemm_before 110 env LD_LIBRARY_PATH=/tmp/before /tmp/before/bench_gemm_tile $GT
s gemm_after 110 $B/tests/bench_gemm_tile $GT
s pers_before 40 env LD_LIBRARY_PATH=/tmp/before /tmp/before/bench_persistent
s pers_after 40 $B/tests/bench_persistent
s fifo_after 50 $R -n 2 --mps on --timeout 45 $B/tests/bench_persistent --fifo
s pc_before 50 env LD_LIBRARY_PATH=/tmp/before $R -n 2 --mps on --timeout 45 $B/tests/bench_port_channel
left=$(( 560 - ($(date +%s) - T0) ))
[ $left -gt 30 ] && s ctest_sel $left ctest --test-dir $B -R 'persistent_gpu|gpu_comm_ft|gpu_nccl_ft' --output-on-failure --timeout 200
