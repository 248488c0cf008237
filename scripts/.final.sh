start=$(date +%s)
tar xzf gpu-bundle/build.tgz -C gpu-bundle
B=gpu-bundle/build
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=20s OMP_NUM_THREADS=4
python3 -m pip install -q --no-index --no-deps --target /tmp/maco-site gpu-bundle/whl/*.whl > /dev/null 2>&1
echo "== maco-perf smoke"
timeout 60 $B/tools/maco-run -n 2 --timeout 50 $B/tools/maco-perf allreduce -b 8 -e 1M -f 8 -m 2 -N 2 -a 1 -G 2 -c 1 > $OUT/perf1.txt 2>&1; echo "perf1 rc=$?"; tail -8 $OUT/perf1.txt
timeout 60 $B/tools/maco-run -n 2 --timeout 50 $B/tools/maco-perf ./build/all_gather_perf -b 8 -e 4M -f 4 -g 1 -t 1 -z 0 -d bfloat16 -c 1 > $OUT/perf2.txt 2>&1; echo "perf2 rc=$?"; tail -6 $OUT/perf2.txt
echo "== bench"
PYTHONPATH=/tmp/maco-site timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 tests/python/bench_fused.py --sets tp,llama70b --sizes 1024,4096,8192 --out-dtypes bfloat16 --comm-workers 0,16,32 --iters 10 --warmup 3 --json $OUT/bench_fused.json --trace $OUT/fused-trace.json > $OUT/bench_fused.txt 2>&1; echo "bench rc=$?"; grep -E "^\| (tp|llama)" $OUT/bench_fused.txt | cut -d'|' -f2-4,6-12
left=$((575 - ($(date +%s) - start)))
PYTEST_WHEELS=$PWD/gpu-bundle/whl BUDGET_S=$left bash scripts/gpu-verify.sh suite 2>&1 | tail -6
