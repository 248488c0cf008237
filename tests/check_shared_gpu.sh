#!/usr/bin/env bash
# Two ranks on one GPU without MPS (ctest gpu_shared_no_mps). By default the communicator
# refuses them with a message saying how to share; with MACO_SHARED_GPU=1 it accepts them,
# warns once that kernels time-slice, and maco-perf allreduce finds no wrong value.
#   usage: check_shared_gpu.sh MACO_RUN MACO_PERF
set -uo pipefail
run=$1 perf=$2
# One GPU, and no MPS server reachable (a system-wide one would make the ranks its clients).
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_MPS_PIPE_DIRECTORY=/nonexistent/maco-no-mps
fail() { echo "FAIL: $1"; echo "$2" | tail -n 40; exit 1; }
# No GPU at all: skip before starting ranks (a rank that fails first can have maco-run stop
# the other before it prints why, which made a CI run read no reason and fail once).
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIP: no GPU (nvidia-smi -L fails)"
  exit 77
fi

out=$("$run" -n 2 --mps off --timeout 120 "$perf" allreduce -b 8 -e 8 -n 1 -w 0 2>&1)
if grep -q "no usable CUDA device" <<<"$out"; then
  echo "SKIP: $(grep -m1 'no usable CUDA device' <<<"$out" | sed 's/^\[[0-9]*\] //')"
  exit 77
fi
grep -q "use the same GPU and neither is an MPS client" <<<"$out" ||
  fail "without MPS or MACO_SHARED_GPU, sharing a GPU is not refused with its reason" "$out"
grep -q "MACO_SHARED_GPU=1" <<<"$out" || fail "the refusal does not say how to share" "$out"

out=$(MACO_SHARED_GPU=1 "$run" -n 2 --mps off --timeout 300 "$perf" allreduce -b 8 -e 64K -f 8 \
        -n 3 -w 1 -c 2 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "maco-perf with MACO_SHARED_GPU=1 exited $rc" "$out"
grep -Eq "Wrong values +: 0 OK" <<<"$out" || fail "wrong values with MACO_SHARED_GPU=1" "$out"
grep -q "without MPS (MACO_SHARED_GPU=1)" <<<"$out" || fail "no time-slice warning" "$out"
grep -q "2 ranks share each GPU" <<<"$out" || fail "maco-perf does not say ranks share a GPU" "$out"
echo "$out" | grep -E "^\[0\] +[0-9]+ " | sed 's/^\[0\] //'
echo "PASS: refused without MPS, correct with MACO_SHARED_GPU=1 (time slices)"
