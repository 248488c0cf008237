#!/usr/bin/env bash
# Runs the hierarchical all-to-all's checks and measurements (issue 17) on a lent one-GPU
# machine from the checkout's root, over a carried build (build/, or gpu-bundle/build from
# scripts/gpu-bundle.sh; scripts/gpu-common.sh makes ctest's paths resolve). Ranks share the
# GPU under MPS (maco-run starts and stops it); nodes are simulated (--simulate-nodes:
# MACO_HOST_ID, TCP over loopback between them). Logs go to $OUT; a summary is printed last.
#   usage: bash scripts/gpu-hier-a2a.sh [sweep|tune|final]
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-common.sh
T0=$(date +%s)
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s}
RUN=$B/tools/maco-run
PERF=$B/tools/maco-perf
TEST=$B/tests/test_gpu_mp
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; nproc; date -u; } > "$OUT/machine.txt" 2>&1
mode=${1:-sweep}
# The new tests as ctest runs them (2 nodes x 2 with 32 MiB and 4 MiB scratch, 4 nodes x 1),
# maco-perf's checked alltoall with hier forced, and the one-node refusal.
step ctest-hier-a2a 200 ctest --test-dir "$B" -R 'gpu_hier_a2a' -V
step one-node-refusal 40 "$RUN" -n 2 --timeout 38 "$TEST" --gtest_filter='P2P.AllToAllHier*'
if [ "$mode" = tune ]; then
  # hier with 8, 4, 2 and 1 CTAs (MACO_HIER_CTAS: fewer, larger segments) against the direct
  # path, 2 nodes x 2, float32; then 4 nodes x 1 with the default 8.
  for algo in direct hier8 hier4 hier2 hier1; do
    e=(); case $algo in hier*) e=(MACO_ALGO_ALLTOALL=hier MACO_HIER_CTAS=${algo#hier}) ;; esac
    step "tune-2x2-$algo" 40 env "${e[@]}" "$RUN" -n 4 --simulate-nodes 2 --timeout 38 \
      "$PERF" alltoall -b 1K -e 64M -f 2 -d float32 -n 10 -w 3 -c 1
  done
  for algo in direct hier8; do
    e=(); case $algo in hier*) e=(MACO_ALGO_ALLTOALL=hier) ;; esac
    step "tune-4x1-$algo" 40 env "${e[@]}" "$RUN" -n 4 --simulate-nodes 4 --timeout 38 \
      "$PERF" alltoall -b 1K -e 64M -f 4 -d float32 -n 10 -w 3 -c 1
  done
fi
if [ "$mode" = sweep ]; then
  # hier against the direct path (default: ll up to 64 KiB per block, copy above), float32,
  # size = the whole buffer (nranks blocks), 2 nodes x 2 and 4 nodes x 1.
  for shape in "2 2x2" "4 4x1"; do
    set -- $shape
    for algo in hier direct; do
      env_algo=(); [ "$algo" = hier ] && env_algo=(MACO_ALGO_ALLTOALL=hier)
      step "sweep-$2-$algo" 40 env "${env_algo[@]}" "$RUN" -n 4 --simulate-nodes "$1" --timeout 38 \
        "$PERF" alltoall -b 4K -e 64M -f 4 -d float32 -n 5 -w 2 -c 1
    done
  done
fi
# The hier collectives and the direct all-to-all paths across nodes, for regressions.
step coll-2x2 60 "$RUN" -n 4 --simulate-nodes 2 --timeout 58 "$TEST" \
  --gtest_filter='Collectives.GraphReplayedWithChangingInputs:Collectives.MixedCallsBackToBack:Collectives.RankOrderFoldBitwise'
step p2p-2x2 80 "$RUN" -n 4 --simulate-nodes 2 --timeout 78 "$TEST" \
  --gtest_filter='P2P.AllToAllEveryType*:P2P.GraphReplayed*:P2P.MixedCalls*:P2P.AllToAllv*'
if [ "$mode" = final ]; then
  # The default (2x2: hier; 4x1: direct) against the direct path forced (ll, copy) and hier
  # forced, float32.
  for algo in default ll copy; do
    e=(); [ "$algo" != default ] && e=(MACO_ALGO_ALLTOALL=$algo)
    step "final-2x2-$algo" 40 env "${e[@]}" "$RUN" -n 4 --simulate-nodes 2 --timeout 38 \
      "$PERF" alltoall -b 1K -e 64M -f 2 -d float32 -n 10 -w 3 -c 1
  done
  for algo in default hier; do
    e=(); [ "$algo" != default ] && e=(MACO_ALGO_ALLTOALL=$algo)
    step "final-4x1-$algo" 40 env "${e[@]}" "$RUN" -n 4 --simulate-nodes 4 --timeout 38 \
      "$PERF" alltoall -b 1K -e 64M -f 4 -d float32 -n 10 -w 3 -c 1
  done
  step p2p-1node 60 "$RUN" -n 4 --timeout 58 "$TEST" --gtest_filter='P2P.*'
fi
for f in "$OUT"/sweep-*.txt "$OUT"/tune-*.txt "$OUT"/final-*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .txt): $(grep -E 'Wrong values' "$f" | sed 's/^\[[0-9]*\] //' | sort -u | tr '\n' ' ')"
  sed 's/^\[[0-9]*\] //' "$f" | grep -E '^ +[0-9]' | awk '{printf "%11s %10s %8s %8s %6s %s\n", $1, $6, $7, $8, $9, $NF}'
done
echo "== failures"
grep -hE 'Failure|\[  FAILED  \]|rror:|timed out|maco-run:' "$OUT"/ctest-*.txt "$OUT"/one-node*.txt "$OUT"/coll-*.txt "$OUT"/p2p-*.txt 2>/dev/null | head -20
echo "== gtest results per run (rank 0)"
for f in "$OUT"/ctest-*.txt "$OUT"/one-node*.txt "$OUT"/coll-*.txt "$OUT"/p2p-*.txt; do
  [ -f "$f" ] || continue
  echo "-- $(basename "$f" .txt)"
  grep -E '(^|: )\[0\] \[ +(OK|SKIPPED|FAILED) +\]|Test +#' "$f" | sed 's/^[0-9]*: //' | head -20
done
echo "================ summary ($(( $(date +%s) - T0 )) s)"; printf '%s\n' "${summary[@]}"
# At most 8 files come back: everything in one tarball next to the summary.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.txt)
