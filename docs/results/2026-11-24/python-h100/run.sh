#!/bin/bash
# The python helper's device run (issue 19): GPU checks of the maco package.
set -u
cd "$(dirname "$0")"
B=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MACO_DEVICE_TIMEOUT=20s TEST_MACO_RUN=$B/tools/maco-run
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$B/tests
nvidia-smi -L
python3 -c "import maco, torch, cupy, sys; print(sys.version.split()[0], 'maco', maco.__version__, maco.cuda_device_count(), 'torch', torch.__version__, 'cupy', cupy.__version__)"
cd tests
step() {
  name=$1; shift; echo "=== $name: ${*:2}"; s=$(date +%s)
  timeout "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "rc=$rc in $(( $(date +%s) - s )) s"
  [ "$name" = example ] && grep -E "^\[0\] [0-9] " "$OUT/$name.log"
  grep -E "PASS|FAIL|TIME|SKIP|Traceback|Error|passed|failed" "$OUT/$name.log" | head -${LINES_PER_STEP:-30}
}
for s in ${STEPS:-coll4 backend patch pytest coll2 example pytest_gpu}; do
  case $s in
    coll4) step coll4 90 "$TEST_MACO_RUN" -n 4 --timeout 85 python3 gpu_collectives.py ;;
    coll2) step coll2 40 "$TEST_MACO_RUN" -n 2 --timeout 35 python3 gpu_collectives.py ;;
    backend) step backend 60 "$TEST_MACO_RUN" -n 1 --mps on --timeout 55 torchrun --nproc-per-node 4 --master-port 29517 gpu_torch_backend.py backend ;;
    patch) step patch 50 "$TEST_MACO_RUN" -n 1 --mps on --timeout 45 torchrun --nproc-per-node 4 --master-port 29518 gpu_torch_backend.py patch ;;
    pytest) CUDA_VISIBLE_DEVICES= step pytest 35 python3 -m pytest -q -p no:cacheprovider test_cpu.py test_multiprocess.py ;;
    example) step example 40 "$TEST_MACO_RUN" -n 1 --mps on --timeout 35 env -u MACO_RANK -u MACO_WORLD_SIZE -u MACO_LOCAL_RANK -u MACO_BOOTSTRAP_ADDR -u MACO_BOOTSTRAP_NONCE torchrun --nproc-per-node 4 --master-port 29519 ../examples/torchrun_example.py ;;
    pytest_gpu) LINES_PER_STEP=12 step pytest_gpu 110 python3 -m pytest -q -s -p no:cacheprovider test_gpu.py ;;
  esac
done
tail -3 "$OUT/pytest_gpu.log" 2>/dev/null
