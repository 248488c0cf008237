#!/usr/bin/env bash
# Real clients of MACO's libnccl and of the maco backend on a machine with several GPUs (e.g.
# 4 H200s): the multi-process NCCL tests, the Python package's GPU tests as ctest runs them,
# and PyTorch's process groups on the maco backend under torchrun. From the checkout's root,
# over the bundle of scripts/gpu-pack.sh carried as gpu-bundle/
# (build.tgz: the build, MACO's libnccl and tests/nccl; whl/: the package's cp312 wheel built
# against that build). The machine has no internet; nothing is installed into its python3.
# Stages, in the order given (default: both):
#   tests  ctest's gpu_nccl_mp_3 (3 ranks on 4 GPUs: each on the GPU of its local rank, no
#          MPS) and the CPU nccl_mp_3/4; then ctest's python_gpu entry as ctest runs it,
#          offline: tests/python/run.sh takes python3's own packages and the carried wheel
#          (PYTEST_WHEELS=gpu-bundle/whl)
#   torch  tests/python/gpu_torch_backend.py under torchrun with N = 4 and 3 ranks (fewer
#          when there are fewer GPUs: then ranks share them under maco-run's MPS), modes
#          init-then-set (init_process_group("maco"), then set_device), device-id
#          (init_process_group("maco", device_id=...), collectives before set_device), backend
#          (set_device, then init), patch (N = 4 only): every collective checked with random
#          data and poisoned outputs, a tensor on another GPU refused with the error checked
# Each step is bounded; the whole call by BUDGET_S (default 570 s: the device tool stops a
# command at 600 s); steps that no longer fit are listed as skipped. Logs in $OUT (one
# archive, clients-<stages>.tgz, and summary.txt); the summary is printed last.
#   usage: bash scripts/gpu-clients.sh [tests] [torch]      DRY_RUN=1 prints the commands
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests torch)
for s in "${stages[@]}"; do
  [[ " tests torch " == *" $s "* ]] || { echo "gpu-clients.sh: unknown stage '$s' (tests, torch)" >&2; exit 2; }
done
dry=${DRY_RUN:-0}
if [ "$dry" = 0 ]; then
  . scripts/gpu-common.sh # $OUT, $B, ctest's paths made to resolve here, NCCL_NVLS_ENABLE=0
  ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
else
  OUT=${OUT:-/tmp/maco-out} B=build ngpu=${NGPU:-4}
fi
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-20s} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
whl=$PWD/gpu-bundle/whl
BUDGET_S=${BUDGET_S:-570}
start=$(date +%s)
summary=()
step() { # NAME TIMEOUT COMMAND...
  local name=$1 t=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - start)))
  if [ "$dry" != 0 ]; then
    echo "[$name, ${t}s] $*"
    return 0
  fi
  if [ "$left" -lt 30 ]; then
    summary+=("$(printf '%-24s skipped (budget)' "$name")")
    return 0
  fi
  [ "$t" -le "$left" ] || t=$left
  local t0
  t0=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-24s rc=%-3d %4ds  %s' "$name" "$rc" $(($(date +%s) - t0)) \
    "$(grep -aE 'passed|failed|PASSED|FAILED|tests passed|^FAIL|Error' "$OUT/$name.txt" | tail -1 | cut -c1-160)")")
}

if [ "$dry" = 0 ]; then
  {
    echo "stages: ${stages[*]}; $ngpu GPUs"
    nvidia-smi -L
    python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
    python3 -c "import importlib.metadata as m
for d in ('pytest', 'numpy', 'nanobind', 'scikit-build-core', 'torch'):
    try:
        print(d, m.version(d))
    except m.PackageNotFoundError:
        print(d, 'MISSING')"
    ls -l "$whl"
  } > "$OUT/machine.txt" 2>&1
fi

for s in "${stages[@]}"; do
  case $s in
  tests)
    # As ctest runs it (tests/CMakeLists.txt), offline: run.sh must not reach for the network.
    step nccl_mp 80 ctest --test-dir "$B" -R '^(gpu_)?nccl_mp_' -V
    step python_gpu 480 env PYTEST_WHEELS="$whl" ctest --test-dir "$B" -R '^python_gpu$' -V
    ;;
  torch)
    [ "$dry" != 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
      --target /tmp/site "$whl"/maco-*.whl > "$OUT/pip.txt" 2>&1 ||
      summary+=("pip install of $whl failed: see pip.txt")
    port=29560
    for n in 4 3; do
      for mode in init-then-set device-id backend patch; do
        [ "$mode" != patch ] || [ "$n" = 4 ] || continue
        port=$((port + 1))
        run=(torchrun --nproc-per-node "$n" --master-port "$port"
          tests/python/gpu_torch_backend.py "$mode")
        if [ "$ngpu" -lt "$n" ]; then # ranks share GPUs: under a private MPS daemon
          run=("$PWD/$B/tools/maco-run" -n 1 --mps on --timeout 110 "${run[@]}")
        fi
        step "torch_${n}_$mode" 120 env PYTHONPATH="/tmp/site:$PWD/tests/python" "${run[@]}"
      done
    done
    ;;
  esac
done
[ "$dry" = 0 ] || exit 0
{
  echo "=== clients on $ngpu GPUs: ${stages[*]}"
  printf '%s\n' "${summary[@]}"
  for f in "$OUT"/torch_*.txt; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f" .txt)"
    grep -aE 'PASS gpu_torch|FAIL|Error|error' "$f" | sed 's/^\[[0-9]*\] //' | sort | uniq | head -8
  done
  [ -f "$OUT/python_gpu.txt" ] && { echo "--- python_gpu"; grep -aE '^run.sh|passed|failed|SKIP' "$OUT/python_gpu.txt" | head -8; }
  [ -f "$OUT/nccl_mp.txt" ] && { echo "--- nccl_mp"; grep -aE '(EachRankUses|AbortStops).*(OK|FAILED|SKIPPED) \]|tests passed|Test +#' "$OUT/nccl_mp.txt" | head -12; }
} > "$OUT/summary.txt"
name=clients-$(IFS=-; echo "${stages[*]}")
(cd "$OUT" && tar czf "/tmp/$name.tgz" --exclude summary.txt . && find . -type f ! -name summary.txt -delete && mv "/tmp/$name.tgz" .)
cat "$OUT/summary.txt"
