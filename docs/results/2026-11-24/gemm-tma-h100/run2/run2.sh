#!/usr/bin/env bash
# Where the GMMA tile's time goes: bench_gemm_tile with per-task profiles, default split and
# more schedulers.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
i=0
for args in "--tiles cublasdx,gmma" "--tiles gmma --schedulers 16" "--tiles gmma --schedulers 33"; do
  i=$((i+1)); echo "== bench $args --profile"
  timeout 60 ./bench_gemm_tile --iters 30 $args --profile > "$OUT/bench-$i.txt" 2>&1
  echo "rc=$?"; grep -v "^#" "$OUT/bench-$i.txt"
done
