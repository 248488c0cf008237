#!/usr/bin/env bash
# Issue 33, part 2's runs (real NCCL clients on MACO's libnccl.so.2 with one process driving
# several GPUs) on a lent GPU machine (2 or 4 GPUs), over a carried build
# (scripts/gpu-issue23-bundle.sh packs MACO's libnccl and tests/nccl's binaries with it).
#   usage: bash scripts/gpu-issue33.sh STAGE [STAGE...]
# Stages (each fits one device call of 10 minutes on 4 GPUs):
#   1proc       ctest gpu_nccl_1proc (tests/nccl/nccl_1proc_check.c: CuPy's sequence on every
#               stream kind, in-place sendrecv, registration with another GPU current, the
#               current device after every call), gpu_nccl_cupy (cupy_check.py; skips without
#               CuPy), gpu_1proc_2, and the p2p suite with the in-place test on 2 and all GPUs
#               (test_gpu_mp --gtest_filter='P2P.*' under maco-run, one rank per GPU)
#   nccl-tests  tests/nccl/run_nccl_tests.sh over NCCL_TESTS_DIR (a checkout of NVIDIA's
#               nccl-tests the caller brings, e.g. v2.19.6) and the build; NCCL_TESTS_ONLY
#               ("all_reduce sendrecv ...") splits it over several calls if it needs more than
#               10 minutes (the objects stay in $OUT/nccl-tests/build between calls)
#   suite       ctest -L gpu (the whole GPU suite, for regressions)
# Logs in $OUT (default /tmp/maco-out); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [ ! -e build ] && [ ! -d gpu-bundle/build ] && [ -f gpu-bundle/build.tgz ]; then
  tar xzf gpu-bundle/build.tgz -C gpu-bundle || exit 1
fi
. scripts/gpu-common.sh
export MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-30s}
R="$B/tools/maco-run"
ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
{ nvidia-smi -L; nvidia-smi topo -m; "$B/tools/maco-info"; } > "$OUT/machine.txt" 2>&1

for stage in "$@"; do
  case $stage in
  1proc)
    step ctest-1proc 420 ctest --test-dir "$B" -R 'gpu_nccl_1proc|gpu_nccl_cupy|gpu_1proc_2' \
      --output-on-failure --timeout 300
    for n in 2 "$ngpu"; do
      [ "$n" -ge 2 ] || continue
      step "p2p-n$n" 240 "$R" -n "$n" --timeout 230 "$B/tests/test_gpu_mp" --gtest_filter='P2P.*'
      [ "$n" -eq 2 ] && [ "$ngpu" -eq 2 ] && break
    done
    ;;
  nccl-tests)
    if [ -z "${NCCL_TESTS_DIR:-}" ] || [ ! -e "${NCCL_TESTS_DIR}/src/common.cu" ]; then
      summary+=("nccl-tests: set NCCL_TESTS_DIR to a checkout of NVIDIA's nccl-tests")
    else
      step nccl-tests 590 tests/nccl/run_nccl_tests.sh "$NCCL_TESTS_DIR" "$B" "$OUT/nccl-tests"
      [ -f "$OUT/nccl-tests/summary.txt" ] && cp "$OUT/nccl-tests/summary.txt" "$OUT/nccl-tests-summary.txt"
    fi
    ;;
  suite)
    step gpu-suite 590 ctest --test-dir "$B" -L gpu --output-on-failure --timeout 300
    ;;
  *)
    echo "gpu-issue33.sh: unknown stage '$stage'" >&2
    exit 2
    ;;
  esac
done
echo "================ machine ($ngpu GPU(s))"
head -n 4 "$OUT/machine.txt"
for f in "$OUT"/ctest-1proc.txt "$OUT"/gpu-suite.txt; do
  [ -f "$f" ] && grep -E 'tests passed|Failed|Skipped|\*\*\*|PASS:|FAIL:|SKIP:' "$f" | head -n 30
done
for f in "$OUT"/p2p-n*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -E 'InPlace|PASSED|FAILED' "$f" | sort | uniq -c | head; }
done
[ -f "$OUT/nccl-tests-summary.txt" ] && { echo "== nccl-tests"; cat "$OUT/nccl-tests-summary.txt"; }
echo "================ summary"
printf '%s\n' "${summary[@]}"
