#!/usr/bin/env bash
# The main job: install, build, then run maco-perf allreduce on every local GPU next to
# NCCL (when the system has it). Arguments replace the default maco-perf arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
build=${BUILD_DIR:-build}
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$ngpus" -ge 1 ] || ngpus=1 # maco-perf then says why no GPU is usable (no driver, ...)
export NCCL_NVLS_ENABLE=0
if [ $# -eq 0 ]; then
  set -- -b 8 -e 1G -f 2 -d bfloat16
  # Side by side with NCCL when the system has it (or MACO_NCCL_LIBRARY names it).
  if [ -n "${MACO_NCCL_LIBRARY:-}" ] || ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
    set -- "$@" --nccl
  else
    echo "bench.sh: NCCL not found (no libnccl.so.2 in ldconfig's cache); running MACO alone." \
      "For the NCCL column: pip install nvidia-nccl-cu13 and set MACO_NCCL_LIBRARY to its" \
      "nvidia/nccl/lib/libnccl.so.2, or install the libnccl2 package" >&2
  fi
fi
exec "$build/tools/maco-run" -n "$ngpus" "$build/tools/maco-perf" allreduce "$@"
