#!/usr/bin/env bash
# GPU checks of libmaco_nccl.so on a one-GPU machine (ranks share the GPU under MPS).
set -u
cd "$(dirname "$0")"
mkdir -p /work && ln -sfn "$PWD" /work/wt-nccl
B=/work/wt-nccl/build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
REAL=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
ls -la "$REAL" 2>&1 | head -3
echo "== app, 4 ranks on MACO"
timeout 100 $B/tools/maco-run -n 4 --timeout 95 $B/tests/nccl/nccl_gpu_check > $OUT/app4.log 2>&1; echo "rc=$?"
grep -E "nccl_gpu_check|PASS|FAIL|rank 0:|wrong values in|error|ERROR" $OUT/app4.log | head -60
echo "== PyTorch, torchrun 4 ranks, LD_PRELOAD"
mkdir -p /tmp/mlog
timeout 120 $B/tools/maco-run -n 1 --mps on --timeout 115 -- env -u MACO_RANK -u MACO_WORLD_SIZE -u MACO_LOCAL_RANK -u MACO_BOOTSTRAP_ADDR -u MACO_BOOTSTRAP_NONCE \
  LD_PRELOAD=$B/src/nccl/libmaco_nccl.so MACO_NCCL_LIBRARY=$REAL/libnccl.so.2 MACO_LOG_LEVEL=info MACO_LOG_FILE=/tmp/mlog/maco-%p.log \
  torchrun --standalone --nproc-per-node 4 /work/wt-nccl/tests/nccl/torch_check.py > $OUT/torch.log 2>&1; echo "rc=$?"
grep -vE "^\s*$" $OUT/torch.log | tail -40
cat /tmp/mlog/*.log > $OUT/torch-maco-log.txt 2>/dev/null
grep -hE "nccl:|ERROR|WARN" /tmp/mlog/*.log | sort | uniq -c | sort -rn | head -30
echo "== app, 2 ranks on MACO"
timeout 40 $B/tools/maco-run -n 2 --timeout 38 $B/tests/nccl/nccl_gpu_check > $OUT/app2.log 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|wrong values in|error|ERROR" $OUT/app2.log | head -20
echo "== app, 1 rank on the real NCCL ($REAL)"
LD_LIBRARY_PATH=$REAL timeout 20 $B/tools/maco-run -n 1 --timeout 19 $B/tests/nccl/nccl_gpu_check > $OUT/app1-real.log 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|not MACO|version|error" $OUT/app1-real.log | head -10
echo "== app, 1 rank on MACO with collectives and send/recv forwarded"
MACO_NCCL_FORWARD=ncclAllReduce,ncclBroadcast,ncclSend,ncclRecv MACO_NCCL_LIBRARY=$REAL/libnccl.so.2 MACO_LOG_LEVEL=info \
  timeout 20 $B/tools/maco-run -n 1 --timeout 19 $B/tests/nccl/nccl_gpu_check --expect-forwarded ncclAllReduce,ncclBroadcast,ncclSend,ncclRecv,ncclAllGather > $OUT/app1-fwd.log 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|forwarded|nccl:|error" $OUT/app1-fwd.log | head -30
