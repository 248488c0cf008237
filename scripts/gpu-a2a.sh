#!/usr/bin/env bash
# Runs the all-to-all / send/recv checks and measurements on a lent one-GPU machine, over a
# bundle of binaries built elsewhere (scripts/gpu-a2a-bundle.sh makes it; ranks share the GPU
# under MPS, which maco-run starts). Logs go to $OUT as one tarball; a short summary is printed
# last. A global budget keeps the whole run under BUDGET seconds (default 440).
#   usage: BUNDLE/gpu-a2a.sh [tests|perf|all]
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/maco-a2a-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-15s}
BUDGET=${BUDGET:-440}
T0=$(date +%s)
RUN=$B/tools/maco-run
summary=()
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 15 ]; then summary+=("$(printf '%-30s skipped (budget)' "$name")"); return 0; fi
  [ "$t" -gt "$left" ] && t=$left
  local t1; t1=$(date +%s)
  timeout -k 5 "$t" "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-30s rc=%-3d %4ds' "$name" "$rc" $(( $(date +%s) - t1 )))")
}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; date -u; } > "$LOG/machine.txt" 2>&1
mode=${1:-all}
if [ "$mode" = final ]; then
  # The whole GPU suite as ctest's gpu_mp_2 / gpu_mp_4 run it (every earlier test as well).
  step suite-n2 120 "$RUN" -n 2 --timeout 115 "$B/tests/test_gpu_mp"
  step suite-n4 120 "$RUN" -n 4 --timeout 115 "$B/tests/test_gpu_mp"
  # The p2p suite under other lane and chunk settings: one lane and 16 KiB chunks (every
  # message many chunks, the credits in use all the time), and 16 lanes.
  step p2p-n4-lanes1-chunk16k 90 env MACO_P2P_LANES=1 MACO_P2P_CHUNK_SIZE=16K "$RUN" -n 4 --timeout 88 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
  step p2p-n4-lanes16 60 env MACO_P2P_LANES=16 "$RUN" -n 4 --timeout 58 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
  step p2p-n3 60 "$RUN" -n 3 --timeout 58 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
  step group-n2 30 "$RUN" -n 2 --timeout 28 "$B/tests/test_group_mp"
  step group-n4 30 "$RUN" -n 4 --timeout 28 "$B/tests/test_group_mp"
  step group-n4-2nodes 30 "$RUN" -n 4 --simulate-nodes 2 --timeout 28 "$B/tests/test_group_mp"
  for n in 2 4; do
    for c in alltoall sendrecv; do
      step "check-$c-n$n" 60 "$RUN" -n $n --timeout 58 "$B/tools/maco-perf" $c -b 8 -e 256M -f 8 -d all -c 1 -n 1 -w 0
    done
  done
  for n in 4 2; do
    for c in alltoall sendrecv; do
      step "perf-$c-n$n" 60 "$RUN" -n $n --timeout 58 "$B/tools/maco-perf" $c -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 --json "$OUT/perf-$c-n$n.json"
      step "perf-$c-n$n-graph" 40 "$RUN" -n $n --timeout 38 "$B/tools/maco-perf" $c -b 8 -e 4M -f 4 -n 20 -w 5 -G 10
    done
    step "perf-allreduce-n$n-ref" 40 "$RUN" -n $n --timeout 38 "$B/tools/maco-perf" allreduce -b 8 -e 4M -f 4 -n 20 -w 5
  done
  for m in ll copy; do
    step "sweep-alltoall-n4-$m" 30 env MACO_ALGO_ALLTOALL=$m "$RUN" -n 4 --timeout 28 "$B/tools/maco-perf" alltoall -b 4K -e 4M -f 2 -n 20 -w 5 -c 1
    step "sweep-sendrecv-n4-$m" 30 env MACO_ALGO_SENDRECV=$m "$RUN" -n 4 --timeout 28 "$B/tools/maco-perf" sendrecv -b 1K -e 1M -f 2 -n 20 -w 5 -c 1
    step "sweep-sendrecv-n2-$m" 30 env MACO_ALGO_SENDRECV=$m "$RUN" -n 2 --timeout 28 "$B/tools/maco-perf" sendrecv -b 1K -e 1M -f 2 -n 20 -w 5 -c 1
  done
  for l in 4 16; do
    step "lanes$l-alltoall-n4" 40 env MACO_P2P_LANES=$l "$RUN" -n 4 --timeout 38 "$B/tools/maco-perf" alltoall -b 8 -e 256M -f 8 -n 20 -w 5 -c 1
    step "lanes$l-sendrecv-n2" 40 env MACO_P2P_LANES=$l "$RUN" -n 2 --timeout 38 "$B/tools/maco-perf" sendrecv -b 8 -e 256M -f 8 -n 20 -w 5 -c 1
  done
  if command -v compute-sanitizer > /dev/null; then
    step memcheck-n2 120 "$RUN" -n 2 --timeout 118 compute-sanitizer --tool memcheck --error-exitcode 99 \
      "$B/tests/test_gpu_mp" --gtest_filter='P2P.*:-P2P.MissingSendTimesOutNamingThePeer'
    step synccheck-n2 90 "$RUN" -n 2 --timeout 88 compute-sanitizer --tool synccheck --error-exitcode 99 \
      "$B/tests/test_gpu_mp" --gtest_filter='P2P.RingSendRecvEverySizeAndMode:P2P.AllPairsTwoMessagesPerPairInOneGroup:P2P.MismatchedCountsReportedByTheReceiver'
    step racecheck-n2 90 "$RUN" -n 2 --timeout 88 compute-sanitizer --tool racecheck --error-exitcode 99 \
      "$B/tests/test_gpu_mp" --gtest_filter='P2P.AllPairsTwoMessagesPerPairInOneGroup:P2P.ZeroCountsDoNothing:P2P.AllToAllvRandomAndZeroCounts'
  fi
  mode=summary
fi
if [ "$mode" != perf ] && [ "$mode" != summary ]; then
  step p2p-n4 150 "$RUN" -n 4 --timeout 145 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
  step p2p-n2 120 "$RUN" -n 2 --timeout 115 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
  step group-n4 30 "$RUN" -n 4 --timeout 28 "$B/tests/test_group_mp"
  step group-n2-2nodes 30 "$RUN" -n 4 --simulate-nodes 2 --timeout 28 "$B/tests/test_group_mp"
  step coll-n4 60 "$RUN" -n 4 --timeout 58 "$B/tests/test_gpu_mp" \
    --gtest_filter='Collectives.MixedCallsBackToBack:Collectives.BadInputWritesNothing:Collectives.GraphReplayedWithChangingInputs'
  for c in alltoall sendrecv; do
    step "check-$c-n4" 45 "$RUN" -n 4 --timeout 43 "$B/tools/maco-perf" $c -b 8 -e 64M -f 8 -d all -c 1 -n 1 -w 0
  done
fi
if [ "$mode" != tests ] && [ "$mode" != summary ]; then
  for n in 4 2; do
    for c in alltoall sendrecv; do
      step "perf-$c-n$n" 45 "$RUN" -n $n --timeout 43 "$B/tools/maco-perf" $c -b 8 -e 256M -f 4 -n 20 -w 5 -c 1
    done
  done
  step perf-alltoall-n4-graph 30 "$RUN" -n 4 --timeout 28 "$B/tools/maco-perf" alltoall -b 8 -e 1M -f 4 -n 20 -w 5 -G 10
  # Crossover of the two ways a message travels (MACO_ALGO_*: ll or copy), 4 ranks.
  for m in ll copy; do
    step "sweep-alltoall-$m" 30 env MACO_ALGO_ALLTOALL=$m "$RUN" -n 4 --timeout 28 "$B/tools/maco-perf" alltoall -b 4K -e 4M -f 2 -n 20 -w 5 -c 1
    step "sweep-sendrecv-$m" 30 env MACO_ALGO_SENDRECV=$m "$RUN" -n 4 --timeout 28 "$B/tools/maco-perf" sendrecv -b 1K -e 1M -f 2 -n 20 -w 5 -c 1
  done
  if command -v compute-sanitizer > /dev/null; then
    step memcheck-n2 90 "$RUN" -n 2 --timeout 88 compute-sanitizer --tool memcheck --error-exitcode 99 \
      "$B/tests/test_gpu_mp" --gtest_filter='P2P.RingSendRecvEverySizeAndMode:P2P.AllToAllvRandomAndZeroCounts:P2P.AllPairsTwoMessagesPerPairInOneGroup'
  fi
fi
echo "================ tests"
for f in "$LOG"/suite-*.txt "$LOG"/p2p-*.txt "$LOG"/group-*.txt "$LOG"/coll-*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .txt): $(grep -cE '\[       OK \]' "$f") OK lines, $(grep -cE '\[  FAILED  \]' "$f") FAILED lines, $(grep -cE '\[  SKIPPED \]' "$f") SKIPPED lines"
  grep -E '\[  PASSED  \]|tests? ran\.' "$f" | sed 's/^/   /' | sort | uniq -c | head -4
  grep -E 'Failure|FAILED  \]|rror:|timed out|async|maco-run:' "$f" | head -12 | sed 's/^/   /'
done
echo "================ maco-perf"
for f in "$LOG"/check-*.txt "$LOG"/perf-*.txt "$LOG"/sweep-*.txt "$LOG"/lanes*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .txt): $(grep -E 'Wrong values' "$f" | sed 's/^\[[0-9]*\] //')"
  case "$f" in *check-*) grep -E 'wrong value|maco-perf:|rror' "$f" | head -5 ;;
    *) sed 's/^\[[0-9]*\] //' "$f" | awk '/^ +[0-9]/ {printf "%11s %9s %8s %7s %6s %s\n", $1, $3, $6, $8, $9, $NF}' ;; esac
done
for t in memcheck synccheck racecheck; do
  if [ -f "$LOG/$t-n2.txt" ]; then echo "== $t"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$LOG/$t-n2.txt" | sort | uniq -c; fi
done
echo "================ summary ($(( $(date +%s) - T0 )) s)"; printf '%s\n' "${summary[@]}"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
