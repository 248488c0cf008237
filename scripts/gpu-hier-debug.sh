set -u
R=build/tools/maco-run; P=build/tools/maco-perf
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=8s
run() { local name=$1; shift; echo "=== $name"; timeout 40 env "$@" $R -n 2 --simulate-nodes 2 --timeout 35 $P allreduce -b 8 -e 1M -f 16 -d float32 -c 1 -n 2 -w 1 2>&1 | grep -v "^\[.\] #" | tail -6; }
run base DUMMY_X=1
run nsocks1 MACO_TCP_NSOCKS=1
run ctas1 MACO_HIER_CTAS=1
run ctas1-nsocks1 MACO_HIER_CTAS=1 MACO_TCP_NSOCKS=1
echo "=== gpu_tcp_2 baseline"; timeout 60 env TEST_MACO_PORT_TRANSPORT=auto $R -n 2 --simulate-nodes 2 --timeout 55 build/tests/test_gpu_mp --gtest_filter='PortChannel*' 2>&1 | tail -3
echo "=== debug log base"; timeout 40 env MACO_LOG_LEVEL=debug $R -n 2 --simulate-nodes 2 --timeout 35 $P allreduce -b 8 -e 8 -d float32 -c 1 -n 1 -w 0 > $OUT/debug.txt 2>&1; grep -c . $OUT/debug.txt
