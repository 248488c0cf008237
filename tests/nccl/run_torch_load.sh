#!/usr/bin/env bash
# ctest's nccl_torch_load (CPU): PyTorch's CUDA library loads with MACO's libnccl.so.2 preloaded.
# Python opens extension libraries with RTLD_NOW, so every NCCL function libtorch_cuda.so names
# must be exported (PyTorch 2.15 is built against NCCL 2.30.7 and names ncclCommGrow,
# ncclCommSuspend, ncclCommResume, ncclWinGetUserPtr, ...: a library of 2.28.9's functions stopped
# `import torch` with "undefined symbol"); then PyTorch's ncclGetUniqueId must reach MACO's.
# Exits 77 (ctest's skip) with the reason when no interpreter has PyTorch.
#   usage: tests/nccl/run_torch_load.sh BUILD_DIR
# The interpreter: TORCH_CHECK_PYTHON, else python3 when it has PyTorch, else the Python tests'
# virtual environment (PYTEST_VENV, default ~/.cache/maco/pytest-venv-<python version>, made by
# tests/python/run.sh with PyTorch unless PYTEST_TORCH=0). TORCH_LOAD_LIB replaces the library
# (to see another one fail).
set -uo pipefail
build=$(cd "$1" && pwd)
lib=${TORCH_LOAD_LIB:-$build/nccl/libmaco_nccl.so}
has_torch() {
  "$1" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2> /dev/null
}
py=${TORCH_CHECK_PYTHON:-}
if [ -z "$py" ]; then
  pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2> /dev/null)
  venv=${PYTEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/maco/pytest-venv-$pyver}
  for cand in python3 "$venv/bin/python"; do
    if command -v "$cand" > /dev/null && has_torch "$cand"; then
      py=$cand
      break
    fi
  done
fi
if [ -z "$py" ]; then
  echo "SKIP: no PyTorch in python3 or in ${venv:-PYTEST_VENV} (TORCH_CHECK_PYTHON picks one)"
  exit 77
fi
# NCCL_COMM_ID makes MACO's ncclGetUniqueId write a marker that NCCL's never writes, so the id
# PyTorch gets shows whose ncclGetUniqueId its calls reach (torch.cuda.nccl.version() is the
# version PyTorch was built with, not asked of the library).
NCCL_COMM_ID=127.0.0.1:1 LD_PRELOAD=$lib "$py" - << 'PY'
import sys
import torch  # libtorch_cuda.so and the NCCL functions it names, bound now
uid = torch.cuda.nccl.unique_id()  # ncclGetUniqueId, through PyTorch's binding
print("PyTorch %s (built with NCCL %s) loaded with MACO's libnccl.so.2 preloaded; its unique id "
      "starts %r" % (torch.__version__, ".".join(map(str, torch.cuda.nccl.version())), uid[:15]))
if not uid.startswith(b"MACO NCCL_COMM:"):
    print("FAIL: PyTorch's ncclGetUniqueId did not reach MACO's library")
    sys.exit(1)
PY
