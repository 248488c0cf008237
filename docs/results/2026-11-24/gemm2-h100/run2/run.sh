#!/usr/bin/env bash
# Run 2 on the lent H100 (bundle of branch gemm2 at the bench's --order/--shapes commit): the
# tile order (groups of G tile rows) for the wide and mixed tiles, the pipeline prefetch against
# a drain before every tile (alternated, 200 iterations), a profile, main's baseline once, and
# Nsight Compute's DRAM/L2 bytes of one launch (cuBLAS's kernel, and ours by order).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
W=/tmp/gb; rm -rf $W; mkdir -p $W; tar xzf new.tgz -C $W; tar xzf base.tgz -C $W
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; } > "$OUT/machine.txt" 2>&1
S=$OUT/summary.txt; : > $S
b() { # name timeout libdir cmd... : appended to $OUT/name.txt
  local name=$1 to=$2 lib=$3; shift 3
  local t0=$(date +%s)
  echo "=================== $*" >> $OUT/$name.txt
  LD_LIBRARY_PATH=$lib timeout $to "$@" >> $OUT/$name.txt 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s: $*" | cut -c1-150 | tee -a $S
}
N=$W/new; BA=$W/base
b order 150 $N $N/bench_gemm_tile --iters 100 --tiles gmma --tile-n 256,mix --order 1,4,8,16,32
for i in 1 2; do
  b pd 60 $N $N/bench_gemm_tile --iters 200 --tiles gmma --tile-n 256,mix
  b pd 60 $N env GEMM2_EXPERIMENT_DRAIN=1 $N/bench_gemm_tile --iters 200 --tiles gmma --tile-n 256,mix
done
b prof 60 $N $N/bench_gemm_tile --iters 50 --tiles gmma --tile-n mix --order 1,8 --profile
b base 40 $BA $BA/bench_gemm_tile --iters 100 --tiles gmma
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
if [ -n "$NCU" ]; then
  for sh in 4096x4096x4096 4096x3584x8192 4096x8192x3584; do
    b ncu 40 $N $NCU --clock-control none -k 'regex:nvjet|xmma|gemm|cutlass' --launch-count 1 --metrics $M $N/bench_gemm_tile --iters 1 --tiles gmma --tile-n 256 --shapes $sh
    b ncu 50 $N $NCU --clock-control none -k regex:maco__pk_gemm_gmma --launch-skip 2 --metrics $M $N/bench_gemm_tile --iters 1 --tiles gmma --tile-n 256 --order 1,8 --shapes $sh
  done
else
  echo "no ncu" | tee -a $S
fi
echo "== $(head -1 $OUT/machine.txt)"
for f in order pd prof base; do
  echo "-- $f"; grep -a -E "^ +[0-9]+ |profile|WRONG|NaN|===" $OUT/$f.txt | cut -c1-200
done
echo "-- ncu"; grep -a -E "gemm|duration|bytes|hit_rate|===" $OUT/ncu.txt | grep -v "^==PROF==" | cut -c1-160 | head -60
cat $S
