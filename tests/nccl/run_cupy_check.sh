#!/usr/bin/env bash
# ctest's gpu_nccl_cupy: tests/nccl/cupy_check.py with MACO's libnccl.so.2 preloaded (and first
# on the library path, for a CuPy that opens libnccl.so.2 itself).
#   usage: tests/nccl/run_cupy_check.sh NCCL_LIB_DIR
# NCCL_LIB_DIR is the folder of libmaco_nccl.so (build/nccl). CUPY_CHECK_PYTHON picks the
# interpreter (default python3). Exits 77 (ctest's skip) with the reason printed when there is
# no such interpreter, no CuPy or fewer than 2 GPUs (cupy_check.py says which).
set -uo pipefail
if [ $# -ne 1 ] || [ ! -e "$1/libmaco_nccl.so" ]; then
  echo "usage: $0 NCCL_LIB_DIR (the folder of libmaco_nccl.so)" >&2
  exit 2
fi
lib=$(cd "$1" && pwd)
py=${CUPY_CHECK_PYTHON:-python3}
command -v "$py" > /dev/null || { echo "SKIP: no $py"; exit 77; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
exec env LD_PRELOAD="$lib/libmaco_nccl.so" LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$py" "$(dirname "$0")/cupy_check.py"
