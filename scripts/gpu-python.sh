#!/usr/bin/env bash
# GPU checks of the Python package and of jobs under torchrun, on one GPU shared
# by the ranks through MPS. Run from the checkout's root on the GPU machine, with the build
# carried as gpu-bundle/ (scripts/gpu-bundle.sh) and a cp312 abi3 wheel of the package in
# gpu-bundle/whl/ (built against that libmaco, shipping it). Logs in $OUT; summary last.
#   usage: bash scripts/gpu-verify.sh python-STEP | python-all   (or this script directly;
#          STEPS="..." picks steps)
set -u
source scripts/gpu-common.sh
export PYTHONUNBUFFERED=1 MACO_DEVICE_TIMEOUT=20s TEST_MACO_RUN=$PWD/$B/tools/maco-run
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  gpu-bundle/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/tests/python
nvidia-smi -L
python3 -c "import maco, torch, sys; print(sys.version.split()[0], 'maco', maco.__version__, maco.cuda_device_count(), 'torch', torch.__version__)"
run=$TEST_MACO_RUN
# maco-run's own job variables must not reach torchrun's workers.
clean=(env -u MACO_RANK -u MACO_WORLD_SIZE -u MACO_LOCAL_RANK -u MACO_BOOTSTRAP_ADDR
       -u MACO_BOOTSTRAP_NONCE)
for s in ${STEPS:-example c_torchrun backend patch pytest_gpu pytest_cpu}; do
  case $s in
    example) step example 60 "$run" -n 1 --mps on --timeout 55 "${clean[@]}" torchrun \
        --nproc-per-node 4 --master-port 29519 python-bindings/examples/torchrun_example.py ;;
    c_torchrun) step c_torchrun 60 "$run" -n 1 --mps on --timeout 55 "${clean[@]}" torchrun \
        --nproc-per-node 4 --master-port 29520 --no-python "$B/tests/example_allreduce" ;;
    backend) step backend 120 "$run" -n 1 --mps on --timeout 115 torchrun --nproc-per-node 4 \
        --master-port 29517 tests/python/gpu_torch_backend.py backend ;;
    patch) step patch 90 "$run" -n 1 --mps on --timeout 85 torchrun --nproc-per-node 4 \
        --master-port 29518 tests/python/gpu_torch_backend.py patch ;;
    pytest_gpu) step pytest_gpu 300 python3 -m pytest -q -s -p no:cacheprovider \
        tests/python/test_gpu.py ;;
    coll) for n in 2 4; do step coll_$n 120 "$run" -n $n --timeout 110 python3 \
        tests/python/gpu_collectives.py; done ;;
    persist) for n in 1 2 4; do step persist_$n 150 "$run" -n $n --timeout 140 python3 \
        tests/python/gpu_persistent.py; done ;;
    nccl_boot) step nccl_boot 60 ctest --test-dir "$B" -R '^gpu_nccl_bootstrap_1$' -V ;;
    bench) for b in nccl maco; do step bench_$b 120 torchrun --nproc-per-node 1 \
        --master-port 29521 tests/python/bench_torch_backend.py $b; done ;;
    pytest_cpu) CUDA_VISIBLE_DEVICES= TEST_UNIT=$PWD/$B/tests/test_unit step pytest_cpu 120 \
        python3 -m pytest -q -p no:cacheprovider tests/python/test_cpu.py \
        tests/python/test_multiprocess.py ;;
  esac
done
for f in example c_torchrun backend patch pytest_gpu pytest_cpu bench_nccl bench_maco persist_1 persist_2 persist_4 nccl_boot coll_2 coll_4; do
  [ -f "$OUT/$f.txt" ] && { echo "--- $f"; grep -E "PASS|FAIL|TIME|Traceback|rror|^\[?[0-9]\]? ?[0-9] |result|passed|failed|correct|SKIP|BENCH|Operation|persistent kernel|real NCCL|OK \\]" "$OUT/$f.txt" | head -${LINES_PER_STEP:-16}; }
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
