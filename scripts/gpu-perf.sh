#!/usr/bin/env bash
# MACO against NCCL on a machine with 2 or more GPUs: every GPU path verified, every collective
# checked, then timed against NCCL's classic and symmetric-memory kernels (the NCCL installed
# and the newest), over a carried build (scripts/gpu-pack.sh; docs/multi-gpu-runbook.md says
# what to carry and the calls).
#   usage: bash scripts/gpu-perf.sh STAGE [STAGE...]
# Stages (each fits one device call of 10 minutes on 4 H200s; several may be named):
#   verify      ctest -L gpu (the whole GPU suite), then compute-sanitizer memcheck of the
#               channel and collective suites with one rank per GPU
#   check       maco-perf <each collective> -b 8 -e 1G -f 2 -d all -o all -c 1 (every type,
#               op and size checked once; -n 1 -w 0: no timing): 0 wrong values expected
#   tables-K    run K (1, 2, 3) of the tables: every collective, -R 0 and -R 1, eager and
#               -G 10, -b 8 -e 1G -f 2 --nccl (-R 0: NCCL's classic kernels on cudaMalloc
#               buffers; -R 1: ncclMemAlloc buffers registered as symmetric windows)
#   nccl-new    the tables once more against the newest NCCL (MACO_NCCL_LIBRARY): the
#               image's nvidia-nccl-cu13 wheel, or NEW_NCCL=/path/libnccl.so.2 (carried)
#   report      scripts/perf_report.py over everything in $OUT: tables, targets, runs
# COLLS="allreduce ..." limits the collectives (default: all seven).
# With one GPU the same stages rehearse the scripts: 4 ranks share the GPU under MPS (NCCL
# cannot: maco-perf skips it), the tables run with 1 rank so NCCL's part still runs, sizes
# stop at 64 MiB. Logs and JSON in $OUT (tar'ed into perf-STAGES.tgz at the end, since
# the device tool returns at most 8 files); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
# scripts/gpu-pack.sh packs the build (MACO's libnccl and its tests, which ctest -L gpu runs,
# included) as gpu-bundle/build.tgz, which gpu-common.sh unpacks.
. scripts/gpu-common.sh
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-30s}
R="$B/tools/maco-run"
P="$B/tools/maco-perf"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$ngpu" -ge 2 ]; then
  n=$ngpu; ntab=$ngpu; emax=1G; mps=""
  [ "$ngpu" -gt 4 ] && n=4 && ntab=4
else
  n=4; ntab=1; emax=64M; mps="--mps on"
fi
{ nvidia-smi -L; nvidia-smi topo -m; "$B/tools/maco-info"; python3 -m pip show nvidia-nccl-cu13 2>/dev/null \
  | grep -E '^(Name|Version|Location)'; } > "$OUT/machine.txt" 2>&1
colls=${COLLS:-"allreduce allgather reduce_scatter broadcast reduce alltoall sendrecv"}

# The newest NCCL: NEW_NCCL, else the image's wheel (PyTorch's dependency).
new_nccl() {
  if [ -n "${NEW_NCCL:-}" ]; then echo "$NEW_NCCL"; return; fi
  python3 - <<'EOF' 2>/dev/null
import glob, os
import nvidia.nccl
for d in nvidia.nccl.__path__:
    for f in glob.glob(os.path.join(d, "lib", "libnccl.so*")):
        print(f)
        raise SystemExit
EOF
}

tables() { # suffix [env...]
  local sfx=$1; shift
  for c in $colls; do
    for reg in 0 1; do
      # Every collective at both registrations: -R 0 is the unregistered baseline (NCCL's
      # classic kernels), -R 1 the registered one (its symmetric kernels).
      for g in 0 10; do
        step "perf-$c-R$reg-g$g-$sfx" 120 env "$@" "$R" -n "$ntab" $mps --timeout 115 "$P" "$c" \
          -b 8 -e "$emax" -f 2 --nccl -n 20 -w 5 -R $reg -G $g \
          --json "$OUT/perf-$c-R$reg-g$g-$sfx.json"
      done
    done
  done
}

for stage in "$@"; do
  case $stage in
  verify)
    step gpu-tests 480 ctest --test-dir "$B" -L gpu --output-on-failure --timeout 300
    slow='-*UpTo256MiB*:*LargeMessages*:*PingPong*:*OverManyLaunches*:*EveryAlgorithm*'
    step "memcheck-n$n" 300 "$R" -n "$n" $mps --timeout 290 compute-sanitizer --tool memcheck \
      --error-exitcode 99 "$B/tests/test_gpu_mp" --gtest_filter="$slow"
    ;;
  check)
    for c in $colls; do
      step "check-$c" 150 "$R" -n "$n" $mps --timeout 145 "$P" "$c" -b 8 -e "$emax" -f 2 \
        -d all -o all -c 1 -n 1 -w 0
    done
    ;;
  tables-[1-9])
    tables "run${stage#tables-}"
    ;;
  nccl-new)
    lib=$(new_nccl)
    if [ -z "$lib" ] || [ ! -e "$lib" ]; then
      summary+=("nccl-new: no newer NCCL found (set NEW_NCCL or install nvidia-nccl-cu13)")
    else
      echo "newest NCCL: $lib" >> "$OUT/machine.txt"
      tables new MACO_NCCL_LIBRARY="$lib"
    fi
    ;;
  report)
    python3 scripts/perf_report.py "$OUT" > "$OUT/report.md" 2>&1
    summary+=("report: rc=$? ($(wc -l < "$OUT/report.md") lines in report.md)")
    ;;
  *)
    echo "gpu-perf.sh: unknown stage '$stage'" >&2
    exit 2
    ;;
  esac
done
{ echo "MPS processes left: $(pgrep -c -f nvidia-cuda-mps || true)"; } >> "$OUT/machine.txt"
echo "================ machine ($ngpu GPU(s); collectives with $n ranks, tables with $ntab)"
head -n 4 "$OUT/machine.txt"
for f in "$OUT"/gpu-tests.txt; do
  [ -f "$f" ] && grep -E 'tests passed|Failed|\*\*\*' "$f" | head -n 20
done
for f in "$OUT"/memcheck-*.txt; do
  [ -f "$f" ] && grep -E 'ERROR SUMMARY|PASSED|FAILED' "$f" | sort | uniq -c
done
for f in "$OUT"/perf-*-R1-g0-*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .txt)"; grep -E '^# NCCL|Wrong values' "$f"
  grep -E '^ +[0-9]' "$f" | tail -n 3
done
[ -f "$OUT/report.md" ] && tail -n 40 "$OUT/report.md"
echo "================ summary"; printf '%s\n' "${summary[@]}"
stages=$(echo "$*" | tr ' ' '-')
(cd "$OUT" && tar czf "../perf-$stages.tgz" . && rm -rf ./* && mv "../perf-$stages.tgz" .)
