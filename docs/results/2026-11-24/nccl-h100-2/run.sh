#!/usr/bin/env bash
# GPU checks of issue 18's remaining items on a one-GPU machine (ranks share it under MPS):
# maco_comm_create_from_nccl, ncclCommAbort with a kernel in flight and a dead peer through
# libmaco_nccl.so, maco_mem_alloc_device behind ncclMemAlloc, the ctest entries. Runs from a
# bundle of the build (linked as /work/wt-nccl there, the path the binaries were built at).
set -u
cd "$(dirname "$0")"
mkdir -p /work && ln -sfn "$PWD" /work/wt-nccl
B=/work/wt-nccl/build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
REAL=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
echo "real NCCL: $REAL"
echo "== 1. maco_comm_create_from_nccl, one rank"
MACO_NCCL_LIBRARY=$REAL TEST_NCCL_BOOT=gpu timeout 60 $B/tests/nccl/test_nccl_bootstrap > $OUT/boot1.log 2>&1; echo "rc=$?"
grep -E "OK \]|FAILED|SKIP|PASSED|Failure|rror" $OUT/boot1.log | head -20
echo "== 1b. the same, 2 ranks sharing the GPU"
MACO_NCCL_LIBRARY=$REAL TEST_NCCL_BOOT=gpu timeout 90 $B/tools/maco-run -n 2 --timeout 85 $B/tests/nccl/test_nccl_bootstrap > $OUT/boot2.log 2>&1; echo "rc=$?"
grep -E "OK \]|FAILED|SKIP|PASSED|Duplicate|Failure" $OUT/boot2.log | head -20
echo "== 2. nccl_mp with a GPU, 3 ranks: abort with a kernel in flight, a dead peer"
MACO_DEVICE_TIMEOUT=100s TEST_NCCL_NEEDS_GPU=1 timeout 200 $B/tools/maco-run -n 3 --timeout 190 $B/tests/nccl/test_nccl_mp > $OUT/mp3.log 2>&1; echo "rc=$?"
grep -E "OK \]|FAILED|SKIP|PASSED|ncclCommAbort with|Failure" $OUT/mp3.log | head -40
echo "== 3. ctest: gpu_nccl_bootstrap_1, gpu_nccl_app_4 (ncclMemAlloc on maco_mem_alloc_device), gpu_nccl_torch_4"
cd $B && timeout 330 ctest -R "gpu_nccl_(bootstrap_1|app_4|torch_4)" --output-on-failure > $OUT/ctest.log 2>&1; echo "rc=$?"
grep -E "Test +#|tests passed|PASS|FAIL|SKIP|counters|wrong values" $OUT/ctest.log | head -40
