#!/usr/bin/env bash
# Allreduce algorithm crossover on all local GPUs: every algorithm forced over the sizes
# where they compete, eager and graph-replayed, unregistered (-R 0) and registered (-R 1)
# buffers, with NCCL alongside. Used to place MACO__ONESHOT_CUTOFF (collectives.c) and
# MACO_ALLREDUCE_INPLACE_MAX; results in docs/performance.md.
#   usage: scripts/allreduce-sweep.sh [BUILD_DIR]   (prints one table per run)
set -uo pipefail
B=${1:-build}
export NCCL_NVLS_ENABLE=0
n=$(nvidia-smi -L | grep -c '^GPU')
run() { # label env... -- maco-perf args
  echo "## $*"
  env "$@" 2>&1 | sed 's/^\[[0-9]*\] //' | grep -E '^ +[0-9]|Wrong values'
}
for g in 0 10; do
  gf=""; [ "$g" != 0 ] && gf="-G $g"
  for algo in oneshot_ll twoshot_ll rsag; do
    e=1M; [ $algo = oneshot_ll ] && e=256K
    run MACO_ALGO_ALLREDUCE=$algo "$B/tools/maco-run" -n "$n" --timeout 100 "$B/tools/maco-perf" allreduce -b 16K -e $e -f 2 -n 50 -w 10 $gf
  done
  for R in 0 1; do
    run MACO_ALGO_ALLREDUCE=rsag MACO_ALLREDUCE_INPLACE_MAX=1G "$B/tools/maco-run" -n "$n" --timeout 100 "$B/tools/maco-perf" allreduce -b 1M -e 256M -f 2 -n 20 -w 5 -R $R --nccl $gf
  done
done
