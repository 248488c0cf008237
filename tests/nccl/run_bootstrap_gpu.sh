#!/usr/bin/env bash
# ctest gpu_nccl_bootstrap_1: test_nccl_bootstrap's one-rank GPU case needs the real NCCL.
# Takes MACO_NCCL_LIBRARY when that file exists (the one found at configure time), else the
# system's libnccl.so.2, else one a Python package ships (PyTorch's CUDA wheels bring
# nvidia-nccl); exits 77 (ctest's skip) with the reason when there is none.
#   usage: run_bootstrap_gpu.sh TEST_NCCL_BOOTSTRAP_BINARY
set -u
lib=${MACO_NCCL_LIBRARY:-}
if [ -z "$lib" ] || [ ! -e "$lib" ]; then
  lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
fi
if [ -z "$lib" ] || [ ! -e "$lib" ]; then
  lib=$(python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    for p in glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so.2"), recursive=True):
        print(p)
        raise SystemExit
PY
)
fi
if [ -z "$lib" ] || [ ! -e "$lib" ]; then
  echo "SKIP: no real NCCL (libnccl.so.2) here: not at MACO_NCCL_LIBRARY='${MACO_NCCL_LIBRARY:-}', not known to ldconfig, not in a Python package"
  exit 77
fi
echo "run_bootstrap_gpu.sh: the real NCCL is $lib"
MACO_NCCL_LIBRARY=$lib exec "$1"
