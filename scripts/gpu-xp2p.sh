#!/usr/bin/env bash
# Runs on a lent one-GPU machine over a carried build (scripts/gpu-bundle.sh): send/recv and
# all-to-all between simulated nodes (xp2p, TCP between them; ranks sharing the GPU under MPS):
# the p2p suite and the group tests on 2 nodes x 2 ranks and 2 x 1, maco-perf checks, and
# timings of hier allreduce and all-to-all across 2 x 2. Logs go to $OUT; a summary last.
#   usage: scripts/gpu-xp2p.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-10s}
. scripts/gpu-common.sh
R="$B/tools/maco-run"
T="$B/tests/test_gpu_mp"
P="$B/tools/maco-perf"
step group-2x2 90 "$R" -n 4 --simulate-nodes 2 --timeout 85 "$B/tests/test_group_mp"
step group-2x1 90 "$R" -n 2 --simulate-nodes 2 --timeout 85 "$B/tests/test_group_mp"
step p2p-2x2 240 "$R" -n 4 --simulate-nodes 2 --timeout 230 "$T" --gtest_filter='P2P*'
step p2p-2x1 180 "$R" -n 2 --simulate-nodes 2 --timeout 170 "$T" --gtest_filter='P2P*'
for c in alltoall sendrecv; do
  step "perf-2x2-$c" 90 "$R" -n 4 --simulate-nodes 2 --timeout 85 "$P" $c \
    -b 8 -e 16M -f 8 -d all -c 1 -n 2 -w 1
done
step time-2x2-allreduce 90 "$R" -n 4 --simulate-nodes 2 --timeout 85 "$P" allreduce \
  -b 8 -e 64M -f 8 -d float32 -c 0 -n 10 -w 3
step time-2x2-alltoall 90 "$R" -n 4 --simulate-nodes 2 --timeout 85 "$P" alltoall \
  -b 8 -e 64M -f 8 -d float32 -c 0 -n 10 -w 3
step hier-2x2 120 "$R" -n 4 --simulate-nodes 2 --timeout 110 "$T" --gtest_filter='Collectives*'
echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"
printf '%s\n' "${summary[@]}"
