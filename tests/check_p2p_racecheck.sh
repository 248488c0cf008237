#!/usr/bin/env bash
# The send/recv kernel under compute-sanitizer racecheck (ctest gpu_p2p_racecheck): the tests
# whose groups have local copies, sends and receives in one launch, 2 ranks on one GPU. The
# local-copy step once let thread 0 advance an item's shared state before every warp had read
# it; the functional tests passed by timing, racecheck reported 4 hazards and, under its
# scheduling, wrong data (H100, 2026-11-24). Skips without a GPU or without compute-sanitizer.
#   usage: check_p2p_racecheck.sh MACO_RUN TEST_GPU_MP
set -uo pipefail
run=$1 bin=$2
# No GPU first: that is the reason that matters on a machine without one.
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU (nvidia-smi -L fails)"; exit 77; }
sanitizer=$(command -v compute-sanitizer || true)
[ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
if [ -z "$sanitizer" ]; then
  echo "SKIP: compute-sanitizer is not installed: it comes with the CUDA toolkit" \
    "(<toolkit>/bin/compute-sanitizer; NVIDIA's package cuda-sanitizer-13-0) and is searched" \
    "on PATH and in /usr/local/cuda/bin"
  exit 77
fi
out=$("$run" -n 2 --timeout 280 "$sanitizer" --tool racecheck --error-exitcode 99 "$bin" \
  --gtest_filter='P2P.AllPairsTwoMessagesPerPairInOneGroup:P2P.ZeroCountsDoNothing:P2P.AllToAllvRandomAndZeroCounts' 2>&1)
rc=$?
if grep -q "^\[0\] SKIP:" <<<"$out"; then grep -m1 "SKIP:" <<<"$out" | sed 's/^\[0\] //'; exit 77; fi
echo "$out" | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Race reported|PASSED|FAILED" | sort | uniq -c
if [ $rc -ne 0 ]; then echo "$out" | tail -n 40; echo "FAIL: racecheck exited $rc"; exit 1; fi
echo "PASS: no shared-memory hazard in the send/recv kernel"
