#!/usr/bin/env bash
# Timings: the memory-channel path of the executor with main's libmaco (mainlib/) and this
# branch's, alternating; the 2 nodes x 2 plans against the native (hier) collectives; the
# transport the plans' port channels use. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")"
root=$PWD
ln -sfn "$root" /work/wt-plan2
OUT=${OUT:-/tmp/maco-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=20s
R=/work/wt-plan2/build/tools/maco-run
P=/work/wt-plan2/build/tools/maco-perf
PL=/work/wt-plan2/algorithms/plans
args="-b 4 -e 16M -f 4 -n 20 -w 5 -c 1 -G 20"
for rep in 1 2; do
  for lib in main branch; do
    if [ $lib = main ]; then L="LD_LIBRARY_PATH=$root/mainlib"; else L="LD_LIBRARY_PATH="; fi
    echo "## rep $rep lib $lib: $L MACO_ALGO_ALLREDUCE=plan:$PL/allreduce_rsag_4r.json $R -n 4 $P allreduce $args -d float32"
    env $L MACO_ALGO_ALLREDUCE=plan:$PL/allreduce_rsag_4r.json timeout 60 $R -n 4 --timeout 55 $P allreduce $args -d float32
    echo "## rep $rep lib $lib: allgather_4r int32"
    env $L MACO_ALGO_ALLGATHER=plan:$PL/allgather_4r.json timeout 60 $R -n 4 --timeout 55 $P allgather $args -d int32
  done
done > "$OUT/memory-path-main-vs-branch.txt" 2>&1
a2="-b 4 -e 16M -f 4 -n 10 -w 2 -c 1 -G 10"
{
for plan in allreduce_rsag_2x2 allreduce_oneshot_ll_2x2; do
  echo "## MACO_ALGO_ALLREDUCE=plan:$PL/$plan.json $R -n 4 --simulate-nodes 2 $P allreduce $a2 -d float32"
  MACO_ALGO_ALLREDUCE=plan:$PL/$plan.json timeout 90 $R -n 4 --simulate-nodes 2 --timeout 85 $P allreduce $a2 -d float32
done
echo "## native (hier): $R -n 4 --simulate-nodes 2 $P allreduce $a2 -d float32"
timeout 90 $R -n 4 --simulate-nodes 2 --timeout 85 $P allreduce $a2 -d float32
echo "## MACO_ALGO_ALLGATHER=plan:$PL/allgather_2x2.json ... allgather -d int32"
MACO_ALGO_ALLGATHER=plan:$PL/allgather_2x2.json timeout 90 $R -n 4 --simulate-nodes 2 --timeout 85 $P allgather $a2 -d int32
echo "## native (hier) allgather -d int32"
timeout 90 $R -n 4 --simulate-nodes 2 --timeout 85 $P allgather $a2 -d int32
} > "$OUT/plan-2x2-vs-hier.txt" 2>&1
MACO_LOG_LEVEL=info MACO_ALGO_ALLREDUCE=plan:$PL/allreduce_rsag_2x2.json timeout 60 $R -n 4 --simulate-nodes 2 --timeout 55 $P allreduce -b 1M -e 1M -n 2 -w 1 -d float32 > "$OUT/transport-info.txt" 2>&1
grep -E "transport|plan .* loaded" "$OUT/transport-info.txt" | head -20
grep -E "^## |Wrong values|^\[0\] +[0-9]+ " "$OUT/memory-path-main-vs-branch.txt" "$OUT/plan-2x2-vs-hier.txt" | sed 's/^[^:]*://' | grep -vE "^\[0\] +(4|128|512|2048|8192|32768) "
