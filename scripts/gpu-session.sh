#!/usr/bin/env bash
# Runs on a lent GPU machine over a build made elsewhere and carried along (build/): the GPU
# tests, then maco-perf allreduce against NCCL on 4 (if present) and 2 GPUs, and an
# algorithm sweep. Logs and JSON go to $OUT; a short summary is printed last.
#   usage: scripts/gpu-session.sh [quick|benches|port|sweep|coll|shared]
#   default: tests, compute-sanitizer, channel benchmarks, allreduce tables
#   quick: tests and the allreduce tables; benches: default without compute-sanitizer;
#   port: tests, memcheck of the port-channel tests, the port-channel benchmark (also
#     --pieces) and the memory-channel benchmark;
#   sweep: default plus rsag CTAs x scratch size and the algorithm crossover
#   coll: the collective tests on 4 and 2 GPUs, then maco-perf of every collective on 4
#     GPUs against NCCL (eager and graph-replayed) and on 2 GPUs; COLL_SIZES="-b .. -e .. -f ..",
#     COLL_GRAPH / COLL_N2 = the -G values (0 = eager) on 4 / 2 GPUs, COLL_SWEEP=1 sweeps CTAs,
#     COLL_TYPES=1 checks every type and op, COLL_FILTER = the gtest filter,
#     COLL_LIST = the collectives to time, COLL_REG = the -R values (default 0)
#   transports: one GPU shared under MPS: the GPU suite (CUDA copy, TCP with GPU memory), memcheck
#     of the TCP GPU path, port-channel benchmarks of this build and of OLD_BUILD, bench_port_host
#     over host memory and TCP, allreduce/allgather checked
#   shared: one GPU, ranks sharing it under MPS: ctest -L gpu (SHARED_ROUNDS times) and
#     maco-run -n 4 maco-perf COLL -b 8 -e 64M -f 4 -d all -o all -c 1 for each collective
#     (SHARED_COLLS, SHARED_TEST_TIMEOUT, SHARED_PERF_TIMEOUT in seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-15s}
# $OUT, $B (build/ or the carried gpu-bundle/build), ctest's paths made to resolve here.
. scripts/gpu-common.sh
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
{ nvidia-smi -L; nvidia-smi topo -m; "$B/tools/maco-info"
  # GDRCopy's kernel module would let the proxy write GPU memory (docs/performance.md).
  ls -l /dev/gdrdrv 2>&1; grep -c '^gdrdrv ' /proc/modules | sed 's/^/gdrdrv modules loaded: /'
} > "$OUT/machine.txt" 2>&1
summary=()
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-18s rc=%-3d %4ds' "$name" "$rc" $(( $(date +%s) - t0 )))")
  return 0
}
if [ "${1:-}" = verify2 ]; then
  # Two GPUs, one rank per GPU (and 4 ranks sharing them under MPS): the GPU suite, memcheck
  # of the channel and collective suites, every collective with every type and op checked up
  # to 1 GiB, and the eager tables against NCCL with -R 0 and -R 1.
  step gpu-tests 300 ctest --test-dir "$B" -L gpu -V
  slow='-*UpTo256MiB*:*LargeMessages*:*PingPong*:*OverManyLaunches*:*EveryAlgorithm*'
  step memcheck-n2 200 "$B/tools/maco-run" -n 2 --timeout 190 \
    compute-sanitizer --tool memcheck --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter="$slow"
  for c in allreduce allgather reduce_scatter broadcast reduce; do
    step "check-$c" 100 "$B/tools/maco-run" -n 2 --timeout 95 "$B/tools/maco-perf" $c -b 8 -e 1G \
      -f 4 -d all -o all -c 1 -n 1 -w 0
  done
  for c in allreduce allgather reduce_scatter broadcast reduce; do
    for R in 0 1; do
      step "perf-$c-n2-R$R" 60 "$B/tools/maco-run" -n 2 --timeout 55 "$B/tools/maco-perf" $c \
        -b 8 -e 1G -f 4 --nccl -n 20 -w 5 -R $R --json "$OUT/perf-$c-n2-R$R.json"
    done
  done
  echo "================ gpu tests"; grep -E 'Test +#|tests passed' "$OUT/gpu-tests.txt"
  grep -cE ' OK \]' "$OUT/gpu-tests.txt" | sed 's/^/passing test cases (all ranks): /'
  echo "================ memcheck"; grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck-n2.txt" | sort | uniq -c
  for f in "$OUT"/check-*.txt; do echo "== $(basename "$f" .txt): $(grep -E 'Wrong values' "$f" | head -1)"; done
  for f in "$OUT"/perf-*.txt; do
    echo "== $(basename "$f" .txt) (size, MACO us, busbw | NCCL us, busbw, ratio)"
    sed 's/^\[[0-9]*\] //' "$f" | awk '/^ +[0-9]/ {printf "%11s %9s %7s | %9s %7s %5s\n", $1, $6, $8, $10, $11, $12} /Wrong values/'
  done
  echo "================ summary"; printf '%s\n' "${summary[@]}"
  (cd "$OUT" && tar czf ../verify2.tgz . && rm -f ./* && mv ../verify2.tgz .)
  exit 0
fi
if [ "${1:-}" = transports ]; then
  # One GPU, ranks sharing it under MPS: the GPU suite (CUDA copy and TCP with GPU memory on
  # simulated nodes), memcheck of the TCP GPU path, the port-channel benchmark of this build
  # and of the build in OLD_BUILD (before the transport contract) alternately, the host-memory
  # benchmark over host memory and TCP, and allreduce checked with every type and op.
  nvidia-smi -q | grep -iE 'compute mode|product name' >> "$OUT/machine.txt" 2>&1
  step gpu-tests 420 ctest --test-dir "$B" -L gpu -V
  step memcheck-tcp 240 "$B/tools/maco-run" -n 2 --simulate-nodes 2 --timeout 230 \
    env TEST_MACO_PORT_TRANSPORT=auto MACO_TCP_CHUNK_SIZE=256K compute-sanitizer --tool memcheck \
    --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter='PortChannelGpu.Put*:PortChannelGpu.Device*'
  for i in $(seq "${BENCH_ROUNDS:-2}"); do
    step "bench-port-new-$i" 120 "$B/tools/maco-run" -n 2 --timeout 110 "$B/tests/bench_port_channel"
    if [ -n "${OLD_BUILD:-}" ]; then
      step "bench-port-old-$i" 120 env LD_LIBRARY_PATH="$OLD_BUILD" "$OLD_BUILD/tools/maco-run" -n 2 --timeout 110 \
        "$OLD_BUILD/tests/bench_port_channel"
    fi
  done
  for t in host tcp; do
    step "bench-host-$t" 120 env MACO_TRANSPORT=$t "$B/tools/maco-run" -n 2 --timeout 110 \
      "$B/tests/bench_port_host" -b 1M -e 64M -f 4 -n 10 -l 500
  done
  step perf-allreduce 150 "$B/tools/maco-run" -n 4 --timeout 145 "$B/tools/maco-perf" allreduce \
    -b 8 -e 64M -f 4 -d all -o all -c 1
  step perf-allgather 100 "$B/tools/maco-run" -n 4 --timeout 95 "$B/tools/maco-perf" allgather \
    -b 8 -e 64M -f 4 -d all -c 1
  { echo "MPS processes left: $(pgrep -c -f nvidia-cuda-mps || true)"; ls -d /tmp/maco-mps-* 2>&1; } \
    > "$OUT/leftovers.txt" 2>&1
  echo "================ gpu tests"
  grep -E 'Test +#|tests passed|SKIP:|Failure|maco-run:' "$OUT/gpu-tests.txt" | head -n 40
  grep -cE ' OK \]' "$OUT/gpu-tests.txt" | sed 's/^/passing test cases (all ranks): /'
  echo "================ memcheck tcp"; grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck-tcp.txt" | sort | uniq -c
  for f in "$OUT"/bench-port-*.txt; do
    echo "== $(basename "$f" .txt)"; grep -iE 'round trip|ping-pong|256 MiB|bandwidth' "$f" | head -n 6
  done
  for f in "$OUT"/bench-host-*.txt; do echo "== $(basename "$f" .txt)"; sed 's/^\[0\] //' "$f" | grep -vE '^\[1\]' | tail -n 9; done
  for f in "$OUT"/perf-*.txt; do echo "== $(basename "$f" .txt): $(grep -E 'Wrong values' "$f" | head -1)"; done
  echo "================ leftovers"; cat "$OUT/leftovers.txt"
  echo "================ summary"; printf '%s\n' "${summary[@]}"
  (cd "$OUT" && tar czf ../transports.tgz . && rm -f ./* && mv ../transports.tgz .)
  exit 0
fi
if [ "${1:-}" = shared ]; then
  # One GPU, ranks sharing it through MPS (maco-run starts it): the GPU suite with 2 and 4
  # ranks (SHARED_ROUNDS times), then every collective with every type and op checked.
  nvidia-smi -q | grep -iE 'compute mode|product name' >> "$OUT/machine.txt" 2>&1
  for round in $(seq 1 "${SHARED_ROUNDS:-1}"); do
    step "gpu-tests-$round" "${SHARED_TEST_TIMEOUT:-300}" ctest --test-dir "$B" -L gpu -V
  done
  for c in ${SHARED_COLLS:-allreduce allgather reduce_scatter broadcast reduce}; do
    step "perf-$c" "${SHARED_PERF_TIMEOUT:-100}" "$B/tools/maco-run" -n 4 \
      --timeout $(( ${SHARED_PERF_TIMEOUT:-100} - 5 )) "$B/tools/maco-perf" $c -b 8 -e 64M -f 4 \
      -d all -o all -c 1
  done
  { echo "MPS processes left: $(pgrep -c -f nvidia-cuda-mps || true)"; pgrep -a -f nvidia-cuda-mps; \
    ls -d /tmp/maco-mps-* 2>&1; } > "$OUT/leftovers.txt" 2>&1
  echo "================ machine"; cat "$OUT/machine.txt" | head -n 12
  for f in "$OUT"/gpu-tests-*.txt; do
    echo "================ $(basename "$f" .txt)"
    grep -E 'Test +#|tests passed|SKIP:|Failure|FAILED|maco-run:' "$f" | head -n 40
    grep -cE ' OK \]' "$f" | sed 's/^/passing test cases (all ranks): /'
  done
  for f in "$OUT"/perf-*.txt; do
    echo "================ $(basename "$f" .txt)"
    grep -E 'share each GPU|Wrong values|Out of bounds|maco-perf:|error|FAILED' "$f" | head -n 8
  done
  echo "================ leftovers"; cat "$OUT/leftovers.txt"
  echo "================ summary"; printf '%s\n' "${summary[@]}"
  (cd "$OUT" && tar czf ../shared-results.tgz . && rm -f ./* && mv ../shared-results.tgz .)
  exit 0
fi
if [ "${1:-}" = coll ]; then
  flt="${COLL_FILTER:-Collectives.*:Allreduce.*}"
  step coll-tests-n4 300 "$B/tools/maco-run" -n 4 --timeout 290 "$B/tests/test_gpu_mp" --gtest_filter="$flt"
  step coll-tests-n2 200 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 190 "$B/tests/test_gpu_mp" --gtest_filter="$flt"
  sizes=${COLL_SIZES:--b 8 -e 1G -f 4}
  for c in ${COLL_LIST:-allreduce allgather reduce_scatter broadcast reduce}; do
    for R in ${COLL_REG:-0}; do
      for g in ${COLL_GRAPH:-0 10}; do
        gflag=""; [ "$g" != 0 ] && gflag="-G $g"
        n=4; step "perf-$c-n$n-g$g-R$R" 150 "$B/tools/maco-run" -n $n --timeout 140 "$B/tools/maco-perf" $c $sizes --nccl -n 20 -w 5 -R $R $gflag --json "$OUT/perf-$c-n$n-g$g-R$R.json"
      done
      for g in ${COLL_N2:-}; do
        gflag=""; [ "$g" != 0 ] && gflag="-G $g"
        step "perf-$c-n2-g$g-R$R" 150 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 140 "$B/tools/maco-perf" $c $sizes --nccl -n 20 -w 5 -R $R $gflag --json "$OUT/perf-$c-n2-g$g-R$R.json"
      done
    done
  done
  if [ -n "${COLL_SWEEP:-}" ]; then
    for ctas in 16 32 64 128; do
      for c in allreduce allgather reduce_scatter; do
        echo "## $c MACO_ALLREDUCE_RSAG_CTAS=$ctas"
        MACO_ALLREDUCE_RSAG_CTAS=$ctas MACO_ALGO_ALLREDUCE=rsag MACO_ALGO_ALLGATHER=mesh \
          MACO_ALGO_REDUCE_SCATTER=mesh "$B/tools/maco-run" -n 4 --timeout 100 "$B/tools/maco-perf" \
          $c -b 256K -e 64M -f 2 -n 30 -w 5 -G 5
      done
    done > "$OUT/cta-sweep.txt" 2>&1
    summary+=("cta-sweep          done")
  fi
  [ -n "${COLL_TYPES:-}" ] && step perf-types-n4 200 "$B/tools/maco-run" -n 4 --timeout 190 "$B/tools/maco-perf" allreduce -b 1K -e 4M -f 64 -d all -o all -n 5 -w 1 -c 2
  echo "================ collective tests"
  for f in coll-tests-n4 coll-tests-n2; do
    echo "-- $f"; grep -E '^\[0\] \[ +(FAILED|SKIPPED) +\]|Failure|PASSED|tests, listed|first wrong|wrong element|ERROR' "$OUT/$f.txt" | head -n 12
  done
  for f in "$OUT"/perf-*.txt; do
    [ -f "$f" ] || continue
    echo "================ $(basename "$f" .txt) (size, MACO time, busbw, #wrong | NCCL time, busbw, ratio | algo)"
    sed 's/^\[[0-9]*\] //' "$f" | awk '/^ +[0-9]/ {printf "%11s %5s %9s %7s %3s | %9s %7s %5s | %s\n", $1, $4, $6, $8, $9, $10, $11, $12, $13} /^# (Wrong|Out)/' | head -n 40
    grep -E 'maco-perf:|ERROR|error' "$f" | head -n 6
  done
  if [ -f "$OUT/cta-sweep.txt" ]; then
    echo "================ cta sweep (busbw at 256K 512K 1M 2M 4M 8M 16M 32M 64M, graph)"
    sed 's/^\[[0-9]*\] //' "$OUT/cta-sweep.txt" | awk '/^## / {if (line) print line; line=$2" "$3} /^ +[0-9]/ {line=line" "$8} /Wrong values/ {line=line" wrong="$5} END {print line}'
  fi
  echo "================ summary"; printf '%s\n' "${summary[@]}"
  # One archive: the device tool brings back a limited number of files.
  (cd "$OUT" && tar czf ../coll-results.tgz . && rm -f ./* && mv ../coll-results.tgz .)
  exit 0
fi
step gpu-tests 420 ctest --test-dir "$B" -L gpu -V
if [ "${1:-}" = port ]; then
  step sanitize-port 240 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 230 \
    compute-sanitizer --tool memcheck --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter='PortChannel*'
  step bench-port 180 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 170 \
    "$B/tests/bench_port_channel"
  step bench-port-pieces 180 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 170 \
    "$B/tests/bench_port_channel" --pieces
  step bench-channel 180 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 170 \
    "$B/tests/bench_memory_channel"
elif [ "${1:-}" != quick ]; then
  # compute-sanitizer on the 2-GPU suite, without the cases too slow under it.
  slow='-*UpTo256MiB*:*LargeMessages*:*PingPong*:*OverManyLaunches*:*EveryAlgorithm*'
  tools="memcheck racecheck"
  [ "${1:-}" = benches ] && tools=""
  for tool in $tools; do
    step "sanitize-$tool" 240 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 230 \
      compute-sanitizer --tool "$tool" --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter="$slow"
  done
  step bench-channel 180 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 170 \
    "$B/tests/bench_memory_channel"
  step bench-port 180 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 170 \
    "$B/tests/bench_port_channel"
fi
perf="$B/tools/maco-perf allreduce -b 8 -e 1G -f 2 -d bfloat16 --nccl"
if [ "${1:-}" = port ]; then ngpu=0; fi # port mode: no allreduce tables
if [ "$ngpu" -ge 4 ]; then
  step perf-n4 240 "$B/tools/maco-run" -n 4 --timeout 230 $perf --json "$OUT/perf-n4.json"
fi
[ "${1:-}" = port ] || step perf-n2 240 env CUDA_VISIBLE_DEVICES=0,1 "$B/tools/maco-run" -n 2 --timeout 230 $perf --json "$OUT/perf-n2.json"
if [ "${1:-}" = sweep ] && [ "$ngpu" -ge 4 ]; then
  {
    for ctas in 32 64 128; do
      for scratch in 32M 128M; do
        echo "## MACO_ALLREDUCE_RSAG_CTAS=$ctas MACO_SCRATCH_SIZE=$scratch"
        MACO_ALLREDUCE_RSAG_CTAS=$ctas MACO_SCRATCH_SIZE=$scratch MACO_ALGO_ALLREDUCE=rsag \
          "$B/tools/maco-run" -n 4 --timeout 100 "$B/tools/maco-perf" allreduce -b 1M -e 1G -f 4 \
          -n 10 -w 3 -c 1
      done
    done
  } > "$OUT/rsag-sweep.txt" 2>&1
  summary+=("rsag-sweep         done")
fi
if [ "${1:-}" = sweep ] && [ "$ngpu" -ge 4 ]; then
  {
    for algo in oneshot_ll rsag; do
      echo "## MACO_ALGO_ALLREDUCE=$algo"
      MACO_ALGO_ALLREDUCE=$algo "$B/tools/maco-run" -n 4 --timeout 100 "$B/tools/maco-perf" \
        allreduce -b 1K -e $([ $algo = rsag ] && echo 8M || echo 256K) -f 2 -n 50 -w 10
    done
  } > "$OUT/algo-sweep.txt" 2>&1
  summary+=("algo-sweep         done")
fi
echo "================ machine"; head -n 6 "$OUT/machine.txt"
echo "================ gpu tests"
grep -E '\[ +(OK|FAILED|SKIPPED) +\]|tests passed|\*\*\*|SKIP:|Failure|ping-pong' "$OUT/gpu-tests.txt" | grep -E '^[0-9]+: \[0\]|^[0-9]+: \[  |tests passed|\*\*\*|SKIP|Failure' | grep -vE ' OK \]' | head -n 30
grep -cE ' OK \]' "$OUT/gpu-tests.txt" | sed 's/^/passing test cases (all ranks): /'
for f in sanitize-memcheck sanitize-racecheck sanitize-port; do
  [ -f "$OUT/$f.txt" ] || continue
  echo "================ $f"; grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|Invalid|Race' "$OUT/$f.txt" | sort | uniq -c | head -n 12
done
if [ -f "$OUT/bench-port.txt" ]; then
  echo "================ bench-port"; sed 's/^\[0\] //' "$OUT/bench-port.txt" | grep -v '^\[' | head -n 20
fi
if [ -f "$OUT/bench-port-pieces.txt" ]; then
  echo "================ bench-port --pieces"; sed 's/^\[0\] //' "$OUT/bench-port-pieces.txt" | grep -v '^\[' | head -n 40
fi
if [ -f "$OUT/bench-channel.txt" ]; then
  echo "================ bench-channel"; sed 's/^\[0\] //' "$OUT/bench-channel.txt" | grep -v '^\[' | head -n 20
fi
for f in perf-n4 perf-n2; do
  [ -f "$OUT/$f.txt" ] || continue
  echo "================ $f (size, MACO oop time/busbw, MACO ip busbw, NCCL oop time/busbw, ratio)"
  sed 's/^\[[0-9]*\] //' "$OUT/$f.txt" | awk '/^ +[0-9]/ {printf "%11s %9s %7s %7s | %9s %7s %5s | %s %s\n", $1, $6, $8, $12, $14, $15, $16, $9, $13} /^# (Wrong|Out|Avg)/' 
  grep -E 'maco-perf:|ERROR|error' "$OUT/$f.txt" | head -n 8
done
if [ -f "$OUT/rsag-sweep.txt" ]; then
  echo "================ rsag sweep (busbw out-of-place at 1M 4M 16M 64M 256M 1G)"
  sed 's/^\[[0-9]*\] //' "$OUT/rsag-sweep.txt" | awk '/^## / {if (line) print line; line=$2" "$3} /^ +[0-9]/ {line=line" "$8} /Wrong values/ {line=line" wrong="$5} END {print line}'
fi
echo "================ summary"; printf '%s\n' "${summary[@]}"
