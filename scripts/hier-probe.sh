set -u
R=build/tools/maco-run; P=build/tools/maco-perf
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=6s
run() { local name=$1; shift; echo "=== $name"; timeout 45 env "$@" 2>&1 | grep -v "^\[.\] #" | tail -4; }
run check0 $R -n 2 --simulate-nodes 2 --timeout 40 $P allreduce -b 8 -e 1M -f 16 -d float32 -c 0 -n 5 -w 1
run check1 $R -n 2 --simulate-nodes 2 --timeout 40 $P allreduce -b 8 -e 1M -f 16 -d float32 -c 1 -n 2 -w 1
run check1-conn32 CUDA_DEVICE_MAX_CONNECTIONS=32 $R -n 2 --simulate-nodes 2 --timeout 40 $P allreduce -b 8 -e 1M -f 16 -d float32 -c 1 -n 2 -w 1
run 2x2-check0 $R -n 4 --simulate-nodes 2 --timeout 40 $P allreduce -b 8 -e 64M -f 8 -d float32 -c 0 -n 5 -w 1
echo "MPS left: $(pgrep -c nvidia-cuda-mps || true)"
