#!/usr/bin/env bash
# The main job: installs what building needs, builds the library, maco-run and maco-perf (not
# the tests: scripts/test.sh builds and runs those), then runs maco-perf allreduce on every
# local GPU next to NCCL (when the system has it). Arguments replace the default maco-perf
# arguments. Exit status: maco-perf's (0 every value right, 1 a wrong value or an error), 77
# when there is no usable GPU (after saying why), setup's or the build's when those fail.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
have_gpu=1
if [ "$ngpus" -lt 1 ]; then
  have_gpu=0
  # Said before the build, which takes minutes: what will still happen without a GPU.
  echo "bench.sh: no GPU here (nvidia-smi lists none), so nothing can be measured. Still" \
    "building libmaco, maco-run and maco-perf; then maco-perf says why it found no usable GPU" \
    "and bench.sh exits 77 (skipped). Without a GPU, ./scripts/test.sh runs the CPU tests." >&2
  ngpus=1
fi
./scripts/setup.sh build
echo "bench.sh: building libmaco, maco-run and maco-perf in $build (the tests: ./scripts/test.sh)"
./scripts/build.sh maco-run maco-perf
export NCCL_NVLS_ENABLE=0
if [ $# -eq 0 ]; then
  set -- -b 8 -e 1G -f 2 -d bfloat16
  # Side by side with NCCL when the system has it (or MACO_NCCL_LIBRARY names it).
  if [ -n "${MACO_NCCL_LIBRARY:-}" ] || ldconfig -p 2>/dev/null | grep 'libnccl\.so\.2' >/dev/null; then
    set -- "$@" --nccl
  elif [ $have_gpu = 1 ]; then
    echo "bench.sh: NCCL not found (no libnccl.so.2 in ldconfig's cache); running MACO alone." \
      "For the NCCL column: pip install nvidia-nccl-cu13 and set MACO_NCCL_LIBRARY to its" \
      "nvidia/nccl/lib/libnccl.so.2, or install the libnccl2 package" >&2
  fi
fi
exec "$build/tools/maco-run" -n "$ngpus" "$build/tools/maco-perf" allreduce "$@"
