#!/usr/bin/env bash
# ctest's gpu_nccl_torch_4: tests/nccl/torch_check.py under torchrun with 4 ranks, PyTorch
# unmodified, MACO's libnccl.so.2 preloaded; ranks share the GPUs there are (maco-run starts a
# private MPS server: --mps on). Exits 77 (ctest's skip) with the reason printed when there is
# no GPU, no PyTorch with CUDA, or no torchrun.
#   usage: tests/nccl/run_torch_check.sh BUILD_DIR [NPROC]
# TORCH_CHECK_PYTHON picks the interpreter (default python3). The real NCCL for calls MACO
# cannot run is PyTorch's own (nvidia-nccl-cu*), unless MACO_NCCL_LIBRARY names one.
set -uo pipefail
build=$(cd "$1" && pwd)
nproc=${2:-4}
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${TORCH_CHECK_PYTHON:-python3}
skip() {
  echo "SKIP: $*"
  exit 77
}
command -v "$py" > /dev/null || skip "no $py"
why=$("$py" - 2>&1 << 'PY'
try:
    import torch
except Exception as e:
    print("no PyTorch (%s)" % e)
    raise SystemExit(1)
if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    print("PyTorch %s sees no CUDA device" % torch.__version__)
    raise SystemExit(1)
PY
) || skip "$why"
torchrun=$(dirname "$(command -v "$py")")/torchrun
[ -x "$torchrun" ] || torchrun=$(command -v torchrun) || skip "no torchrun next to $py or on PATH"
if [ -z "${MACO_NCCL_LIBRARY:-}" ]; then
  real=$("$py" -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2> /dev/null)
  [ -n "$real" ] && [ -e "$real" ] && export MACO_NCCL_LIBRARY=$real
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
# maco-run -n 1 only starts the MPS server; torchrun starts the ranks, so MACO's own job
# variables are removed from their environment.
exec "$build/tools/maco-run" -n 1 --mps on --timeout 280 -- env -u MACO_RANK -u MACO_WORLD_SIZE \
  -u MACO_LOCAL_RANK -u MACO_BOOTSTRAP_ADDR -u MACO_BOOTSTRAP_NONCE \
  LD_PRELOAD="$build/nccl/libmaco_nccl.so" \
  "$torchrun" --standalone --nproc-per-node "$nproc" "$src/tests/nccl/torch_check.py"
