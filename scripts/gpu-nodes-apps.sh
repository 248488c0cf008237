#!/usr/bin/env bash
# Simulated nodes and applications on a machine with 4 GPUs (e.g. 4 H200s): the multi-node
# tests and maco-perf across 2 simulated nodes, PyTorch jobs on MACO's libnccl and on the maco
# backend against NVIDIA's NCCL, and the fused GEMM + collective operators. From the
# checkout's root, over the bundle of scripts/gpu-pack.sh carried as gpu-bundle/ (the build
# packed as build.tgz, MACO's libnccl and its tests included, and the package's wheel in whl/).
# Stages, run in the order given, each step bounded, the whole call by BUDGET_S (default
# 570 s: the device tool stops a command at 600 s; steps that no longer fit are listed as
# skipped):
#   nodes  4 ranks as 2 simulated nodes x 2 (maco-run --simulate-nodes 2, TCP between the
#          nodes, memory channels inside), one GPU per rank (maco-run gives each simulated
#          node GPUs of its own when there are enough):
#          what ctest's multi-node entries run (gpu_tcp_4_two_nodes, gpu_hier_four_two,
#          gpu_hier_a2a_four_two(_small), gpu_hier_a2a_perf, gpu_hier_killed_rank,
#          gpu_plan_2x2, gpu_plan_algo_2x2, group_mp_4_two_nodes), the P2P suite at 2 x 2 and
#          the collectives at 4 nodes x 1; then the ctest entries themselves (their own command
#          lines; maco-run gives their simulated nodes GPUs of their own too)
#   perf   maco-perf allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall,
#          sendrecv at 2 x 2 and at 1 node x 4 with the same flags (PERF_FLAGS), checked
#          (-c 1), JSON; the 2 x 2 runs log which transport each proxy uses; markdown tables
#          (scripts/nodes_tables.py)
#   apps   tests/nccl/torch_check.py under torchrun (4 ranks) with MACO's libnccl preloaded;
#          tests/python/bench_ddp.py (ddp and tp-mlp) with NVIDIA's NCCL, with MACO's libnccl
#          preloaded and with the maco backend, compared by scripts/compare_runs.py (ddp:
#          against the noise floor of a --perturb-ulp run of NVIDIA's NCCL); from 2 GPUs
#          bench_ddp --backends nccl,maco (both in one job, turns alternating);
#          maco_comm_create_from_nccl on a 4-rank NCCL communicator (test_nccl_bootstrap)
#   fused  tests/python/bench_fused.py at world size 4 with --trace
# With fewer than 4 GPUs the same steps run with ranks sharing the GPU(s) under MPS (maco-run
# --mps on), the parts that need NVIDIA's NCCL at world size 1, and the summary says so.
# Logs, JSON and tables go to $OUT: summary.txt, tables.md, fused-trace.json and
# nodes-apps-STAGES.tgz with everything (the device tool brings back 8 files). A short summary
# is printed last.
#   usage: bash scripts/gpu-nodes-apps.sh [nodes] [perf] [apps] [fused]    (default: all four)
#   DRY_RUN=1 prints the commands instead of running them; NGPU=n pretends n GPUs (with
#   DRY_RUN, to see the plan of another machine).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(nodes perf apps fused)
for s in "${stages[@]}"; do
  [[ " nodes perf apps fused " == *" $s "* ]] ||
    { echo "gpu-nodes-apps.sh: unknown stage '$s' (nodes, perf, apps, fused)" >&2; exit 2; }
done
dry=${DRY_RUN:-0}
if [ "$dry" = 0 ]; then
  # $OUT, $B (build/ or gpu-bundle/build), ctest's paths made to resolve here,
  # NCCL_NVLS_ENABLE=0.
  . scripts/gpu-common.sh
else
  OUT=${OUT:-/tmp/maco-out} B=build
fi
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s} PYTHONUNBUFFERED=1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
R=$PWD/$B/tools/maco-run
P=$PWD/$B/tools/maco-perf
T=$PWD/$B/tests/test_gpu_mp
PRE=$PWD/$B/nccl/libmaco_nccl.so
if [ -n "${NGPU:-}" ]; then
  ngpu=$NGPU
else
  ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
fi
[ "$dry" != 0 ] || [ "$ngpu" -gt 0 ] || { echo "gpu-nodes-apps.sh: no GPU (nvidia-smi -L)"; exit 1; }
if [ "$ngpu" -ge 4 ]; then
  setting="$ngpu GPUs: one GPU per rank"
  nccl_n=4
else
  setting="$ngpu GPU(s) only: 4 ranks share them under MPS (these times describe ranks sharing a GPU, not NVLink); NVIDIA's NCCL at world size $ngpu"
  nccl_n=$ngpu
fi

BUDGET_S=${BUDGET_S:-570}
start=$(date +%s)
summary=()
# step NAME TIMEOUT COMMAND...: COMMAND into $OUT/NAME.txt, bounded by TIMEOUT and by what is
# left of BUDGET_S; a summary line with rc, seconds and the last PASS/FAIL/SKIP-like line.
step() {
  local name=$1 t=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - start)))
  if [ "$dry" != 0 ]; then
    printf '%s (%ss):' "$name" "$t"
    printf ' %q' "$@"
    printf '\n'
    return 0
  fi
  if [ "$left" -lt 30 ]; then
    summary+=("$(printf '%-24s skipped: %ds of BUDGET_S=%d left' "$name" "$left" "$BUDGET_S")")
    return 0
  fi
  [ "$t" -le "$left" ] || t=$left
  local t0
  t0=$(date +%s)
  timeout -k 15 "$t" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  local last
  last=$(grep -E '^(\[[0-9]+\] )?(PASS|FAIL|SKIP)|tests passed|Wrong values|PASSED|FAILED|maco-run:.*(timed out|exited)' \
    "$OUT/$name.txt" | tail -1 | cut -c1-110)
  summary+=("$(printf '%-24s rc=%-3d %4ds  %s' "$name" "$rc" $(($(date +%s) - t0)) "$last")")
}

# TRUN: torchrun with one process per rank, directly when every rank has a GPU, else under a
# private MPS server started by maco-run (whose own job variables are dropped).
#   trun NPROC TIMEOUT [VAR=VALUE...]; then: step NAME TIMEOUT "${TRUN[@]}" SCRIPT [ARGS...]
clean=(env -u MACO_RANK -u MACO_WORLD_SIZE -u MACO_LOCAL_RANK -u MACO_BOOTSTRAP_ADDR
  -u MACO_BOOTSTRAP_NONCE)
trun() {
  local n=$1 t=$2
  shift 2
  TRUN=(env "$@" torchrun --standalone --nproc-per-node "$n")
  if [ "$n" -gt "$ngpu" ]; then
    TRUN=("$R" -n 1 --mps on --timeout "$((t - 5))" "${clean[@]}" "$@" torchrun --standalone
      --nproc-per-node "$n")
  fi
}

# NODES: maco-run of 4 ranks as K simulated nodes; maco-run gives each node GPUs of its own
# when there are at least K (one per rank with 4 GPUs, no MPS), else they share under MPS.
#   nodes K TIMEOUT; then: step NAME TIMEOUT [env VAR=VALUE...] "${NODES[@]}" PROGRAM [ARGS...]
nodes() {
  local k=$1 t=$2
  NODES=("$R" -n 4 --simulate-nodes "$k" --timeout "$((t - 5))" --)
}

# The real NCCL (the fallback of MACO's libnccl, test_nccl_bootstrap's communicator):
# MACO_NCCL_LIBRARY, else PyTorch's (nvidia-nccl), else the system's.
real_nccl() {
  if [ -n "${MACO_NCCL_LIBRARY:-}" ] && [ -e "$MACO_NCCL_LIBRARY" ]; then
    echo "$MACO_NCCL_LIBRARY"
    return
  fi
  python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2> /dev/null ||
    ldconfig -p 2> /dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}'
}

# The package from the carried wheel (as scripts/gpu-python.sh installs it).
python_setup() {
  [ -z "${python_done:-}" ] || return 0
  python_done=1
  [ "$dry" = 0 ] || return 0
  if [ -d gpu-bundle/whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      gpu-bundle/whl/*.whl > "$OUT/pip.txt" 2>&1 ||
      summary+=("pip install of gpu-bundle/whl failed: see pip.txt")
  fi
  export PYTHONPATH=/tmp/site:$PWD/tests/python
  {
    python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version())"
    python3 -c "import maco; print('maco', maco.__version__, maco.__file__)"
  } >> "$OUT/machine.txt" 2>&1
}

if [ "$dry" = 0 ]; then
  {
    echo "stages: ${stages[*]}; $setting"
    nvidia-smi -L
    nvidia-smi topo -m
    "$B/tools/maco-info"
    echo "RDMA devices (none: TCP between simulated nodes):"
    ibv_devinfo -l 2>&1 | head -n 5
  } > "$OUT/machine.txt" 2>&1
fi
echo "gpu-nodes-apps.sh: stages ${stages[*]}; $setting"

PERF_FLAGS=${PERF_FLAGS:--b 8 -e 256M -f 4 -c 1 -n 20 -w 5}
COLLS=${COLLS:-allreduce allgather reduce_scatter broadcast reduce alltoall sendrecv}
nccl_lib=$(real_nccl)
for s in "${stages[@]}"; do
  case $s in
    nodes)
      # What ctest's multi-node entries run (tests/CMakeLists.txt), one GPU per rank.
      nodes 2 120
      step tcp_2x2 120 env TEST_MACO_PORT_TRANSPORT=auto MACO_TCP_CHUNK_SIZE=256K \
        "${NODES[@]}" "$T" --gtest_filter='PortChannel*'
      step hier_2x2 120 "${NODES[@]}" "$T" --gtest_filter='Collectives*'
      step p2p_2x2 120 "${NODES[@]}" "$T" --gtest_filter='P2P*'
      nodes 2 90
      for scratch in 32M 4M; do
        step "a2a_hier_2x2_$scratch" 90 env MACO_SCRATCH_SIZE=$scratch \
          "${NODES[@]}" "$T" --gtest_filter='P2P.AllToAllHier*'
      done
      step a2a_hier_perf_2x2 90 env MACO_ALGO_ALLTOALL=hier "${NODES[@]}" "$P" alltoall \
        -b 64 -e 16M -f 8 -n 2 -w 1 -c 2 -G 2 -d all
      step group_2x2 90 "${NODES[@]}" "$PWD/$B/tests/test_group_mp"
      step plan_2x2 90 env PLAN_TEST_SHAPE=2x2 "${NODES[@]}" "$PWD/$B/tests/test_plan_gpu"
      plans=$PWD/algorithms/plans
      pargs=(-b 4 -e 4M -f 32 -n 2 -w 1 -c 2 -G 2 --inplace)
      step plan_algo_2x2_allreduce 90 env "MACO_ALGO_ALLREDUCE=plan:$plans/allreduce_rsag_2x2.json" \
        "${NODES[@]}" "$P" allreduce "${pargs[@]}" -d float32
      step plan_algo_2x2_reduce_scatter 90 \
        env "MACO_ALGO_REDUCE_SCATTER=plan:$plans/reduce_scatter_2x2.json" \
        "${NODES[@]}" "$P" reduce_scatter "${pargs[@]}" -d int32
      step plan_algo_2x2_allgather 90 env "MACO_ALGO_ALLGATHER=plan:$plans/allgather_2x2.json" \
        "${NODES[@]}" "$P" allgather "${pargs[@]}" -d int32
      step killed_rank_2x2 90 env TEST_KILL_RANK=1 MACO_DEVICE_TIMEOUT=10s "${NODES[@]}" "$T" \
        --gtest_filter=Collectives.RankKilledMidCallIsNamed
      nodes 4 120
      step hier_4x1nodes 120 "${NODES[@]}" "$T" --gtest_filter='Collectives*'
      # The ctest entries as they are (both nodes' ranks on GPUs 0 and 1, under MPS).
      step ctest_multinode 300 ctest --test-dir "$B" --output-on-failure --timeout 280 \
        -R '^(gpu_tcp_4_two_nodes|gpu_plan_2x2|gpu_plan_algo_2x2|gpu_hier_.*)$'
      ;;
    perf)
      nodes 2 150
      for c in $COLLS; do
        # shellcheck disable=SC2086 # PERF_FLAGS is a list of flags
        step "perf-2x2-$c" 150 "${NODES[@]}" env MACO_LOG_LEVEL=info MACO_LOG_SUBSYS=proxy \
          "$P" "$c" $PERF_FLAGS --json "$OUT/perf-2x2-$c.json"
        # shellcheck disable=SC2086
        step "perf-4x1-$c" 120 "$R" -n 4 --timeout 115 "$P" "$c" $PERF_FLAGS \
          --json "$OUT/perf-4x1-$c.json"
      done
      # shellcheck disable=SC2086 # COLLS is a list of names
      [ "$dry" != 0 ] || python3 scripts/nodes_tables.py "$OUT" $COLLS > "$OUT/nodes-tables.md"
      ;;
    apps)
      python_setup
      trun 4 120 "LD_PRELOAD=$PRE" "MACO_NCCL_LIBRARY=$nccl_lib"
      step torch_check_4 120 "${TRUN[@]}" tests/nccl/torch_check.py
      for mode in ddp tp-mlp; do
        trun "$nccl_n" 200
        step "$mode-nccl" 200 "${TRUN[@]}" tests/python/bench_ddp.py --mode "$mode" \
          --backend nccl --label "$mode-nccl" --json "$OUT/$mode-nccl.json"
        trun 4 200 "LD_PRELOAD=$PRE" "MACO_NCCL_LIBRARY=$nccl_lib"
        step "$mode-nccl-on-maco" 200 "${TRUN[@]}" tests/python/bench_ddp.py --mode "$mode" \
          --backend nccl --label "$mode-libnccl-maco" --json "$OUT/$mode-nccl-on-maco.json"
        trun 4 200
        step "$mode-maco-backend" 200 "${TRUN[@]}" tests/python/bench_ddp.py --mode "$mode" \
          --backend maco --label "$mode-maco-backend" --json "$OUT/$mode-maco-backend.json"
        noise=()
        if [ "$mode" = ddp ]; then
          # The noise floor: the reference with every gradient moved by about a bf16 ulp
          # (bench_ddp --perturb-ulp; compare_runs --noise takes its tolerance from it).
          trun "$nccl_n" 200
          step ddp-nccl-noise 200 "${TRUN[@]}" tests/python/bench_ddp.py --mode ddp \
            --backend nccl --perturb-ulp --label ddp-nccl-perturbed --json "$OUT/ddp-nccl-noise.json"
          noise=(--noise "$OUT/ddp-nccl-noise.json")
        fi
        step "compare-$mode" 30 python3 scripts/compare_runs.py "$OUT/$mode-nccl.json" \
          "$OUT/$mode-nccl-on-maco.json" "$OUT/$mode-maco-backend.json" "${noise[@]}" \
          --markdown "$OUT/compare-$mode.md"
      done
      if [ "$ngpu" -ge 2 ]; then
        # NCCL and the maco backend in one job, their turns alternating (bench_ddp
        # --backends): step times that drift between separate jobs does not blur.
        trun "$nccl_n" 300
        step ddp-compare 300 "${TRUN[@]}" tests/python/bench_ddp.py --mode ddp \
          --backends nccl,maco --rounds 4 --steps 30 --json "$OUT/ddp-compare.json"
      fi
      if [ "$ngpu" -ge 4 ]; then
        step from_nccl_4 90 "$R" -n 4 --timeout 85 env TEST_NCCL_BOOT=gpu \
          "MACO_NCCL_LIBRARY=$nccl_lib" "$PWD/$B/tests/nccl/test_nccl_bootstrap"
      else
        step from_nccl_1 90 env TEST_NCCL_BOOT=gpu "MACO_NCCL_LIBRARY=$nccl_lib" \
          tests/nccl/run_bootstrap_gpu.sh "$PWD/$B/tests/nccl/test_nccl_bootstrap"
      fi
      ;;
    fused)
      python_setup
      trun 4 300
      step fused_4 300 "${TRUN[@]}" tests/python/bench_fused.py --json "$OUT/fused.json" \
        --trace "$OUT/fused-trace.json"
      ;;
  esac
done
[ "$dry" = 0 ] || exit 0

{ echo "MPS processes left: $(pgrep -c nvidia-cuda-mps || true)"; ls -d /tmp/maco-mps-* 2>&1; } \
  > "$OUT/leftovers.txt" 2>&1
# Tables to paste into docs/performance.md, in one file.
{
  echo "# Nodes and applications: ${stages[*]} ($setting)"
  echo
  for f in nodes-tables.md compare-ddp.md compare-tp-mlp.md; do
    [ -f "$OUT/$f" ] && { echo "## $f"; echo; cat "$OUT/$f"; echo; }
  done
  if [ -f "$OUT/fused.json" ]; then
    echo "## bench_fused"
    echo
    python3 -c "import json; print(json.load(open('$OUT/fused.json'))['table'])"
  fi
} > "$OUT/tables.md" 2>&1
{
  echo "================ gpu-nodes-apps.sh ${stages[*]}: $setting"
  grep -E '^(GPU [0-9]|maco|python)' "$OUT/machine.txt"
  echo "================ steps (rc, seconds, last PASS/FAIL/SKIP line)"
  printf '%s\n' "${summary[@]}"
  ls "$OUT"/perf-2x2-*.txt > /dev/null 2>&1 &&
    echo "transports between the simulated nodes: $(grep -ho 'proxy uses the [A-Za-z_]* transport' \
      "$OUT"/perf-2x2-*.txt | sort | uniq -c | tr '\n' ';')"
  for f in "$OUT"/*-nccl*.txt "$OUT"/*-maco-backend.txt "$OUT"/fused_4.txt; do
    [ -f "$f" ] && grep -hE '^(\[[0-9]+\] )?(RESULT|SKIP)' "$f" | cut -c1-200
  done
  for f in compare-ddp.md compare-tp-mlp.md; do
    [ -f "$OUT/$f" ] && { echo "---- $f"; grep '^|' "$OUT/$f"; }
  done
  [ -f "$OUT/fused.json" ] && { echo "---- bench_fused"; python3 -c "import json; print(json.load(open('$OUT/fused.json'))['table'])"; }
  cat "$OUT/leftovers.txt"
} > "$OUT/summary.txt" 2>&1
# One archive of everything; summary, tables and the trace also on their own.
name="nodes-apps-$(IFS=-; echo "${stages[*]}")"
keep=(summary.txt tables.md fused-trace.json)
(
  cd "$OUT" || exit 1
  tar czf "/tmp/$name.tgz" . || exit 1
  for f in *; do
    case " ${keep[*]} " in *" $f "*) ;; *) rm -rf -- "$f" ;; esac
  done
  mv "/tmp/$name.tgz" .
)
cat "$OUT/summary.txt"
