#!/usr/bin/env bash
# The plan GPU tests (run.sh) and the memory-path timings (main's libmaco against this
# branch's, perf.sh's first part, three alternations), on the branch's final build.
set -uo pipefail
cd "$(dirname "$0")"
root=$PWD
OUT=${OUT:-/tmp/maco-out}
bash "$root/run.sh"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=20s
R=/work/wt-plan2/build/tools/maco-run
P=/work/wt-plan2/build/tools/maco-perf
PL=/work/wt-plan2/algorithms/plans
args="-b 4 -e 16M -f 4 -n 20 -w 5 -c 1 -G 20"
for rep in 1 2 3; do
  for lib in main branch; do
    if [ $lib = main ]; then L="LD_LIBRARY_PATH=$root/mainlib"; else L="LD_LIBRARY_PATH="; fi
    echo "## rep $rep lib $lib: $L MACO_ALGO_ALLREDUCE=plan:$PL/allreduce_rsag_4r.json $R -n 4 $P allreduce $args -d float32"
    env $L MACO_ALGO_ALLREDUCE=plan:$PL/allreduce_rsag_4r.json timeout 60 $R -n 4 --timeout 55 $P allreduce $args -d float32
    echo "## rep $rep lib $lib: allgather_4r int32"
    env $L MACO_ALGO_ALLGATHER=plan:$PL/allgather_4r.json timeout 60 $R -n 4 --timeout 55 $P allgather $args -d int32
  done
done > "$OUT/memory-path-main-vs-branch-final.txt" 2>&1
awk '/^## /{h=substr($0,1,26)} /^\[0\] +(16|4096|65536|1048576|16777216) /{print h, $2, $7}' "$OUT/memory-path-main-vs-branch-final.txt"
