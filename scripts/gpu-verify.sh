#!/usr/bin/env bash
# GPU verification on a machine with one or more GPUs, from the checkout's root, over a carried
# build (scripts/gpu-pack.sh BUILD WHEEL packs it into gpu-bundle/: the build,
# MACO's libnccl and its tests, the Python package's cp312 wheel). Nothing is built or
# downloaded on the GPU machine. docs/multi-gpu-runbook.md says how to bundle and call it.
#   usage: bash scripts/gpu-verify.sh STAGE [STAGE...]
# Stages:
#   fused-tests  the persistent runtime's GPU suite (test_persistent_gpu: GEMM tiles, gates,
#                the three fused operators checked bit for bit, SM and copy-engine modes) at 1,
#                2 and N ranks, one rank per GPU (N = the GPUs, at most 4; ranks share under MPS
#                with one GPU); a dead peer of each copy-engine operator at N ranks
#   fused-quick  test_persistent_gpu's FusedOperators only, at N ranks
#   fused-bench  tests/python/bench_fused.py under torchrun at N ranks: the fused operators
#                against cuBLAS + NCCL, cuBLAS + MACO and PyTorch's async TP (BENCH_ARGS adds
#                or overrides its flags); the table, JSON and one Chrome trace into $OUT
#   suite        ctest -L gpu (every GPU test)
#   tp-layer     tests/python/bench_tp_layer.py under torchrun at N ranks (the Llama-3-70B layer:
#                torch + NCCL, async TP, the overlap API's variants; TP_LAYER_ARGS adds flags)
#   tp-mlp       python-bindings/examples/tp_mlp.py under torchrun at N ranks, with its trace
#   moe-layer    python-bindings/examples/moe_layer.py under torchrun at N ranks, both maco.ep
#                modes (checked against one GPU, timed against all_to_all_single on NCCL)
#   ep-bench     bench_ep at N ranks (dispatch and combine, both shapes; EP_ARGS adds flags)
#   tp-probe     tests/python/bench_tp_probe.py at N ranks: host and GPU time of each maco.tp
#                path, eager and in a CUDA graph (PROBE_ARGS adds flags)
#   nccl-1proc   one process driving every GPU through MACO's libnccl: ctest gpu_nccl_1proc
#                (CuPy's sequence on every stream kind, in-place sendrecv, registration with
#                another GPU current), gpu_nccl_cupy, gpu_1proc_2; the p2p suite (in-place
#                send/recv included) on 2 and N GPUs, one rank per GPU
#   nccl-tests   tests/nccl/run_nccl_tests.sh over NCCL_TESTS_DIR (a checkout of NVIDIA's
#                nccl-tests the caller brings; NCCL_TESTS_ONLY="all_reduce ..." narrows it)
#   clients-*    scripts/gpu-clients.sh's stages (tests, torch): the multi-process NCCL tests,
#                the Python package's GPU tests, PyTorch on the maco backend
#   perf-*       scripts/gpu-perf.sh's stages (verify, check, tables-1..3, nccl-new, report):
#                maco-perf against NCCL for every collective, -R 0/1, eager and -G
#   nodes-*      scripts/gpu-nodes-apps.sh's stages (nodes, perf, apps, fused): 2 simulated
#                nodes x 2, PyTorch jobs on MACO's libnccl and the maco backend, fused operators
#   python-*     scripts/gpu-python.sh's steps (example, c_torchrun, backend, patch, pytest_gpu,
#                pytest_cpu; python-all: every one): the Python package and torchrun jobs with
#                4 ranks sharing one GPU under MPS
# BUDGET_S (default 570) bounds the call; each step has its own limit. The summary is printed
# last; the logs are packed into $OUT/gpu-verify-<stages>.tgz, and a forwarded stage leaves its
# own archive and summary in $OUT/STAGE/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ $# -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
. scripts/gpu-common.sh
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
BUDGET_S=${BUDGET_S:-570}
start=$(date +%s)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
n=$ngpu mps=""
[ "$n" -gt 4 ] && n=4
[ "$n" -lt 2 ] && n=4 && mps="--mps on"
R="$B/tools/maco-run"
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
# The Python package: the carried wheel into a private folder (the image's python3 has torch).
pysite=/tmp/maco-site
if [ -d gpu-bundle/whl ] && [ ! -d "$pysite/maco" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$pysite" gpu-bundle/whl/*.whl \
    > "$OUT/pip.txt" 2>&1
fi
export PYTHONPATH="$pysite${PYTHONPATH:+:$PYTHONPATH}"
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
bounded() { # NAME TIMEOUT COMMAND...: step, unless the budget is spent
  local name=$1 t=$2 l
  shift 2
  l=$(left)
  if [ "$l" -lt 30 ]; then summary+=("$(printf '%-22s skipped (budget)' "$name")"); return; fi
  [ "$t" -le "$l" ] || t=$l
  step "$name" "$t" "$@"
}
for stage in "$@"; do
  case $stage in
  fused-tests)
    for r in 1 2 "$n"; do
      bounded "persistent-gpu-$r" 200 "$R" -n "$r" $mps --timeout 190 \
        "$B/tests/test_persistent_gpu" --gtest_filter=-*NeverGetsItsSignal*:*DeadPeer*
    done
    bounded persistent-gpu-timeout 100 "$R" -n 1 --timeout 90 "$B/tests/test_persistent_gpu" \
      --gtest_filter='*NeverGetsItsSignal*'
    # A peer that does not run a copy-engine operator: named by the others within 3 s.
    for op in GemmAllreduce GemmReduceScatter AllgatherGemm; do
      bounded "persistent-dead-peer-$op" 60 env MACO_DEVICE_TIMEOUT=3s "$R" -n "$n" $mps \
        --timeout 50 "$B/tests/test_persistent_gpu" \
        --gtest_filter="FusedOperators.DeadPeerDuringCopyEngine$op"
    done
    ;;
  fused-quick)
    bounded "fused-operators-$n" 150 "$R" -n "$n" $mps --timeout 140 \
      "$B/tests/test_persistent_gpu" --gtest_filter='FusedOperators*:-*DeadPeer*'
    ;;
  fused-bench)
    # shellcheck disable=SC2086
    bounded "bench-fused-$n" "$(( $(left) - 10 ))" python3 -m torch.distributed.run \
      --nproc-per-node "$n" tests/python/bench_fused.py --json "$OUT/bench_fused.json" \
      --trace "$OUT/fused-trace.json" ${BENCH_ARGS:-}
    ;;
  tp-layer)
    # shellcheck disable=SC2086
    bounded "tp-layer-$n" 300 python3 -m torch.distributed.run --nproc-per-node "$n" \
      tests/python/bench_tp_layer.py --json "$OUT/tp_layer.json" ${TP_LAYER_ARGS:-}
    ;;
  tp-mlp)
    bounded "tp-mlp-$n" 150 python3 -m torch.distributed.run --nproc-per-node "$n" \
      python-bindings/examples/tp_mlp.py --trace "$OUT/tp_mlp_trace.json"
    ;;
  moe-layer)
    for mode in low_latency normal; do
      bounded "moe-layer-$mode-$n" 150 python3 -m torch.distributed.run --nproc-per-node "$n" \
        python-bindings/examples/moe_layer.py --mode "$mode"
    done
    ;;
  tp-probe)
    # shellcheck disable=SC2086
    bounded "tp-probe-$n" 240 python3 -m torch.distributed.run --nproc-per-node "$n" \
      tests/python/bench_tp_probe.py ${PROBE_ARGS:-}
    ;;
  ep-bench)
    # shellcheck disable=SC2086
    bounded "ep-bench-$n" 200 "$R" -n "$n" $mps --timeout 190 "$B/tests/bench_ep" ${EP_ARGS:-}
    ;;
  suite)
    bounded gpu-suite 480 ctest --test-dir "$B" -L gpu --output-on-failure --timeout 300
    ;;
  nccl-1proc)
    bounded ctest-1proc 300 ctest --test-dir "$B" -R 'gpu_nccl_1proc|gpu_nccl_cupy|gpu_1proc_2' \
      --output-on-failure --timeout 240
    for r in 2 "$n"; do
      [ "$ngpu" -ge "$r" ] || continue
      bounded "p2p-$r" 240 "$R" -n "$r" --timeout 230 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
      [ "$r" -eq "$n" ] && break
    done
    ;;
  nccl-tests)
    if [ -z "${NCCL_TESTS_DIR:-}" ] || [ ! -e "${NCCL_TESTS_DIR}/src/common.cu" ]; then
      summary+=("nccl-tests: set NCCL_TESTS_DIR to a checkout of NVIDIA's nccl-tests")
    else
      # The build stays outside $OUT (what comes back from a call is limited in size).
      nt=/tmp/maco-nccl-tests
      bounded nccl-tests "$(( $(left) - 10 ))" tests/nccl/run_nccl_tests.sh "$NCCL_TESTS_DIR" "$B" "$nt"
      mkdir -p "$OUT/nccl-tests" && cp "$nt"/*.log "$nt"/summary.txt "$OUT/nccl-tests/" 2>/dev/null
      [ -f "$nt/summary.txt" ] && cp "$nt/summary.txt" "$OUT/nccl-tests-summary.txt"
    fi
    ;;
  python-*)
    # gpu-python.sh's steps (STEPS), in a folder of their own as the forwarded stages below.
    steps=${stage#python-}
    [ "$steps" = all ] && steps=""
    sub=$OUT/$stage
    mkdir -p "$sub"
    BUDGET_S=$(left) OUT=$sub STEPS=$steps bash scripts/gpu-python.sh > "$OUT/$stage.txt" 2>&1
    summary+=("$(printf '%-22s rc=%d (its summary: %s.txt)' "$stage" $? "$stage")")
    ;;
  clients-* | perf-* | nodes-*)
    # Stages of the larger scripts this entry forwards to: clients-* (gpu-clients.sh: tests,
    # torch), perf-* (gpu-perf.sh: verify, check, tables-1..3, nccl-new, report: every
    # collective against NCCL's classic and symmetric kernels), nodes-* (gpu-nodes-apps.sh:
    # nodes, perf, apps, fused).
    case $stage in
    clients-*) script=scripts/gpu-clients.sh arg=${stage#clients-} ;;
    perf-*) script=scripts/gpu-perf.sh arg=${stage#perf-} ;;
    *) script=scripts/gpu-nodes-apps.sh arg=${stage#nodes-} ;;
    esac
    # Each in a folder of its own, $OUT/STAGE: these scripts pack and clear their $OUT at the
    # end, which would take this entry's files, and their archive would go with the cleanup below.
    sub=$OUT/$stage
    BUDGET_S=$(left) OUT=$sub bash "$script" "$arg" > "$OUT/$stage.txt" 2>&1
    summary+=("$(printf '%-22s rc=%d (its summary: %s.txt)' "$stage" $? "$stage")")
    ;;
  *)
    echo "gpu-verify.sh: unknown stage '$stage'" >&2
    exit 2
    ;;
  esac
done
echo "================ machine ($ngpu GPU(s); $n ranks${mps:+, sharing under MPS})"
head -n 4 "$OUT/machine.txt"
for f in "$OUT"/persistent-gpu-*.txt "$OUT"/fused-operators-*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -E '^\[  (FAILED|PASSED) |Failure|wrong' "$f" | head -8; }
done
[ -f "$OUT/bench-fused-$n.txt" ] && { grep -E '^\| |^FAIL|^PASS|Error|error' "$OUT/bench-fused-$n.txt" | head -70; }
for f in "$OUT"/ctest-1proc.txt "$OUT"/gpu-suite.txt; do
  [ -f "$f" ] && grep -E 'tests passed|Failed|\*\*\*|PASS:|FAIL:|SKIP:' "$f" | head -n 30
done
for f in "$OUT"/p2p-*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -E 'PASSED|FAILED' "$f" | head -4; }
done
for f in "$OUT"/tp-layer-*.txt "$OUT"/tp-mlp-*.txt "$OUT"/ep-bench-*.txt "$OUT"/tp-probe-*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -vE '^\[|^ *$|Warning|warn' "$f" | tail -25; }
done
[ -f "$OUT/nccl-tests-summary.txt" ] && { echo "== nccl-tests"; cat "$OUT/nccl-tests-summary.txt"; }
echo "================ summary"
printf '%s\n' "${summary[@]}"
stages=$(echo "$*" | tr ' ' '-')
keep=(bench_fused.json fused-trace.json)
(cd "$OUT" && tar czf "../gpu-verify-$stages.tgz" --exclude='*.tgz' . && \
  find . -maxdepth 1 -type f ! -name "${keep[0]}" ! -name "${keep[1]}" -delete && \
  mv "../gpu-verify-$stages.tgz" .)
