#!/usr/bin/env bash
# Runs on a lent one-GPU machine over a carried build (scripts/gpu-bundle.sh): the collectives
# across simulated nodes (hier, TCP between nodes, ranks sharing the GPU under MPS), the
# rank-order bitwise test on one node, and maco-perf of every collective checked on 2 simulated
# nodes. Logs go to $OUT; a short summary is printed last.
#   usage: scripts/gpu-hier.sh   (HIER_PERF_MAX: maco-perf's largest size, default 64M;
#          HIER_REPEAT: runs of the test suites with one rank per node, default 1)
set -uo pipefail
cd "$(dirname "$0")/.."
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s}
. scripts/gpu-common.sh
R="$B/tools/maco-run"
T="$B/tests/test_gpu_mp"
max=${HIER_PERF_MAX:-64M}
step bitwise-1node-4 150 "$R" -n 4 --timeout 140 "$T" --gtest_filter='Collectives.RankOrderFoldBitwise'
step hier-2x2 300 "$R" -n 4 --simulate-nodes 2 --timeout 290 "$T" --gtest_filter='Collectives*'
for c in allreduce allgather reduce_scatter broadcast reduce; do
  step "perf-2x2-$c" 60 "$R" -n 4 --simulate-nodes 2 --timeout 55 "$B/tools/maco-perf" $c \
    -b 8 -e "$max" -f 8 -d all -o all -c 1 -n 2 -w 1
done
rep=--gtest_repeat=${HIER_REPEAT:-1}
step hier-4x1 200 "$R" -n 4 --simulate-nodes 4 --timeout 190 "$T" --gtest_filter='Collectives*' "$rep"
step hier-2x1 150 "$R" -n 2 --simulate-nodes 2 --timeout 140 "$T" --gtest_filter='Collectives*' "$rep"
step group-2x2 60 "$R" -n 4 --simulate-nodes 2 --timeout 55 "$B/tests/test_group_mp"
echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"
printf '%s\n' "${summary[@]}"
