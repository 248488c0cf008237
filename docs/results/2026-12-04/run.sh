#!/usr/bin/env bash
# One H200, ranks under MPS (maco-run starts and stops the daemon): the two commits' GPU checks.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
cd "$(dirname "$0")/.."
B=gpu-bundle/bin
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/maco-site gpu-bundle/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/maco-site
echo "== cap test (2 ranks, MPS) $(( $(date +%s) - t0 )) s"
timeout 60 $B/maco-run -n 2 --timeout 55 $B/test_gpu_mp --gtest_filter='Collectives.MaxCtas*' > $OUT/cap.txt 2>&1
echo "cap rc=$?"; grep -E "PASSED|FAILED|OK \]|Failure" $OUT/cap.txt | head -8
echo "== gpu_tp.py (2 ranks, MPS) $(( $(date +%s) - t0 )) s"
timeout 90 $B/maco-run -n 2 --timeout 85 python3 tests/python/gpu_tp.py > $OUT/tp.txt 2>&1
echo "tp rc=$?"; grep -v "^\s*$" $OUT/tp.txt | grep -E "PASS|FAIL|│|┌|└|Total|Error|error" | head -40
echo "== done $(( $(date +%s) - t0 )) s"; pgrep -a nvidia-cuda-mps || echo "no MPS daemon left"
