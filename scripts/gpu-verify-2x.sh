#!/usr/bin/env bash
# Two H200s (one rank per GPU): the GPU suite (CUDA copy, TCP with GPU memory on simulated
# nodes, all-to-all/send/recv, one process driving both GPUs), compute-sanitizer memcheck and
# racecheck of the port-channel and send/recv suites, every collective checked with every
# type and op, all-to-all and send/recv against NCCL, the port-channel benchmark. Logs to $OUT
# as one archive; a short summary last. Needs the build carried as gpu-bundle (gpu-bundle.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/maco-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-15s}
B=build
[ -e "$B" ] || ln -s gpu-bundle/build "$B"
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
summary=(); T0=$(date +%s); BUDGET=${BUDGET:-540}
step() { local name=$1 t=$2; shift 2; local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 20 ]; then summary+=("$name skipped (budget)"); return 0; fi
  [ "$t" -gt "$left" ] && t=$left; local t1; t1=$(date +%s)
  timeout -k 5 "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  summary+=("$(printf '%-22s rc=%-3d %4ds' "$name" "$rc" $(( $(date +%s) - t1 )))"); }
R="$B/tools/maco-run"
step gpu-tests 240 ctest --test-dir "$B" -L gpu -V
step memcheck 150 "$R" -n 2 --timeout 140 compute-sanitizer --tool memcheck --error-exitcode 99 \
  "$B/tests/test_gpu_mp" --gtest_filter='PortChannel*:P2P.*'
step memcheck-tcp 100 "$R" -n 2 --simulate-nodes 2 --timeout 95 env TEST_MACO_PORT_TRANSPORT=auto \
  compute-sanitizer --tool memcheck --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter='PortChannelGpu.*'
for c in allreduce alltoall sendrecv; do
  step "check-$c" 60 "$R" -n 2 --timeout 55 "$B/tools/maco-perf" $c -b 8 -e 256M -f 4 -d all -c 1 -n 1 -w 0
done
for c in alltoall sendrecv; do
  step "perf-$c" 60 "$R" -n 2 --timeout 55 "$B/tools/maco-perf" $c -b 8 -e 1G -f 4 --nccl -n 20 -w 5
done
step bench-port 60 "$R" -n 2 --timeout 55 "$B/tests/bench_port_channel"
echo "================ gpu tests"; grep -E 'Test +#|tests passed' "$OUT/gpu-tests.txt"
grep -cE ' OK \]' "$OUT/gpu-tests.txt" | sed 's/^/passing test cases (all ranks): /'
for f in memcheck memcheck-tcp; do echo "== $f"; grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/$f.txt" | sort | uniq -c; done
for f in "$OUT"/check-*.txt; do echo "== $(basename "$f" .txt): $(grep -E 'Wrong values' "$f" | head -1)"; done
for f in "$OUT"/perf-*.txt; do echo "== $(basename "$f" .txt) (size, MACO us, busbw | NCCL us, busbw, ratio)"
  sed 's/^\[[0-9]*\] //' "$f" | awk '/^ +[0-9]/ {printf "%11s %9s %7s | %9s %7s %5s\n", $1, $6, $8, $10, $11, $12} /Wrong values/'; done
echo "== bench-port"; grep -iE 'round trip|ping-pong' "$OUT/bench-port.txt" | head -4
echo "================ summary"; printf '%s\n' "${summary[@]}"
(cd "$OUT" && tar czf ../verify-2x.tgz . && rm -f ./* && mv ../verify-2x.tgz .)
