#!/usr/bin/env bash
# GMMA GEMM tiles on one GPU: SASS check, persistent GPU tests (1, 2, 4 ranks) with each tile
# implementation, then bench_gemm_tile (cuBLAS, cuBLASDx tiles, GMMA tiles in one run).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$D:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s}
L=$OUT/log.txt
{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv; } > "$L" 2>&1
CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
if [ -n "$CUOBJ" ]; then
  "$CUOBJ" -sass "$D"/libmaco.so.*.*.* > "$OUT/sass.txt" 2>&1
  echo "== SASS: functions and MMA instructions" >> "$L"
  awk '/Function :/{f=$3} /HGMMA|HMMA/{split($0,a,/ +/); for(i in a) if(a[i] ~ /^H(G)?MMA/){c[f" "a[i]]++}} END{for(k in c) print c[k], k}' "$OUT/sass.txt" | grep -i gemm | sort -k2 >> "$L"
  rm -f "$OUT/sass.txt"
else
  echo "no cuobjdump" >> "$L"
fi
t() { # name env filter ranks
  local name=$1 envv=$2 filt=$3 n=$4
  echo "== tests $name: $envv -n $n $filt" >> "$L"
  env $envv timeout 290 "$D/maco-run" -n $n --timeout 280 "$D/test_persistent_gpu" \
    "--gtest_filter=$filt" > "$OUT/$name.txt" 2>&1
  echo "rc=$?" >> "$L"
  grep -E "\] \[  (PASSED|FAILED) " "$OUT/$name.txt" | sort | uniq -c >> "$L"
  grep -E "ERROR" "$OUT/$name.txt" | grep -v "cannot all be resident\|needs workers\|threads = 100" | head -4 >> "$L"
}
ALL='-*NeverGetsItsSignal*'
t default_1 DEFAULT_TILE=1 "$ALL" 1
t default_2 DEFAULT_TILE=1 "$ALL" 2
t default_4 DEFAULT_TILE=1 "$ALL" 4
t gmma_2 MACO_GEMM_TILE=gmma "$ALL" 2
t gmma_4a MACO_GEMM_TILE=gmma '*Gemm*' 4
t gmma_4b MACO_GEMM_TILE=gmma '*Gemm*' 4
echo "== bench_gemm_tile" >> "$L"
timeout 120 "$D/bench_gemm_tile" --iters 50 > "$OUT/bench.txt" 2>&1
echo "rc=$?" >> "$L"
cat "$OUT/bench.txt" >> "$L"
cat "$L"
