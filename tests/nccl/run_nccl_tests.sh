#!/usr/bin/env bash
# run_nccl_tests.sh - NVIDIA's nccl-tests on MACO's libnccl.so.2 (docs/nccl.md, "nccl-tests").
#
# usage: tests/nccl/run_nccl_tests.sh NCCL_TESTS_DIR MACO_BUILD_DIR [OUT_DIR]
#   NCCL_TESTS_DIR  a checkout of https://github.com/NVIDIA/nccl-tests (not part of this tree;
#                   it is only read: objects and binaries go to OUT_DIR/build)
#   MACO_BUILD_DIR  MACO's CMake build folder (its nccl/libmaco_nccl.so, SONAME
#                   libnccl.so.2, is what the tests link and run)
#   OUT_DIR         where the logs go: default $OUT, else ./nccl-tests-out
# Environment:
#   NCCL_INC             folder of the nccl.h to build against (default: NCCL 2.32.6's, the one
#                        MACO's library is built from, in ~/.cache/maco/nccl-2.32.6/include where
#                        scripts/setup.sh puts it, else the CUDA toolkit's include folder);
#                        another version is used too (2.28.9's builds a client of the older ABI,
#                        which the library keeps) and named
#   CUDA_HOME            the toolkit (default: the folder above nvcc's, else /usr/local/cuda)
#   NGPUS                GPUs to use (default: all visible, nvidia-smi -L and
#                        CUDA_VISIBLE_DEVICES)
#   NCCL_TESTS_ONLY      space-separated test names to run (e.g. "all_reduce sendrecv")
#   NCCL_TESTS_TIMEOUT   seconds per run (default 180); a run killed by it is a FAIL
#   MACO_DEVICE_TIMEOUT  passed on (default here 30s: a stuck device wait fails its run soon)
#   MACO_NCCL_LIBRARY    passed on: the real NCCL for calls MACO forwards (none by default:
#                        with MACO's library preloaded, libnccl.so.2 is MACO's own, which the
#                        fallback refuses, so a forwarded call fails and says so)
#
# It builds nccl-tests with its Makefile (make -k -j NCCL_HOME=<OUT_DIR/nccl_home> CUDA_HOME=...,
# NCCL_HOME holding links to NCCL_INC's headers and to MACO's library as libnccl.so and
# libnccl.so.2; NVCC_GENCODE for the GPUs present), lists the tests that did not build
# (alltoall_perf of nccl-tests 2.19.6 needs NCCL 2.29's device API: expected against 2.28.9's
# header; against 2.32.6's it builds, and its device-API kernels are refused when they run),
# then runs every test that built, in one process, with LD_PRELOAD and LD_LIBRARY_PATH
# naming MACO's library, sizes -b 8 -e 64M -f 4, data checks on (-c 1), -w 2 -n 5:
#   -g 1, 2, 4, ... up to the GPUs there are (and that count itself), -R 0
#   -t 2 threads of half the GPUs each (with 2 GPUs or more)
#   -R 1 and -R 2 (registered buffers; -R 2 symmetric windows from ncclMemAlloc), all GPUs
#   -G 5 (CUDA graphs), all GPUs
#   -d all (every data type), with -o all (every op) for the reducing tests, all GPUs, up to 1M
# With mpirun and mpicc on PATH it also builds MPI=1 (into OUT_DIR/build-mpi) and runs each
# test with one process per GPU (-g 1); without them it prints that those runs were skipped
# and why. On 4 GPUs the whole takes about 4 minutes after the build.
# A run whose only fault is wrong values is run again on NVIDIA's NCCL (NCCL_REFERENCE,
# default the system's libnccl.so.2 where there is one): when NCCL reports wrong values too it
# is SAME, not FAIL (its log <test>_<args>.nccl.log). hypercube_perf with 4 or more ranks in
# one process (-g x -t >= 4) is RACE when its only fault is wrong values, whatever NCCL gives:
# the harness's group makes its steps one group, whose sends read what its receives write, so
# its values depend on timing (NVIDIA's NCCL 2.28.3 gave wrong values at -g 4 eager and right
# ones at -g 4 -G 5 on 4 H200s, 2026-11-28); the NCCL rerun is still made and logged.
# Each run's output goes to OUT_DIR/<test>_<args>.log; at the end one line per run:
#   PASS|FAIL|SAME|RACE  <test> <args>  wrong=<sum of the #wrong columns> oob=<"Out of bounds values">
#   busbw=<"Avg bus bandwidth", GB/s>  fallback=<calls MACO forwarded to NCCL, or none>
# and the tests that did not build. MACO logs at info level for its "coll" subsystem so that
# the at-exit line of calls on MACO / forwarded to NCCL and every first forwarding with its
# reason land in the log. Exit status: 0 when every run passed or was SAME or RACE, 1 when one
# failed, 2 on a usage or build error, 77 when there is no GPU (built, nothing run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '4,7p' "$0" >&2
  exit 2
}
if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage; fi
tests_dir=$(cd "$1" 2> /dev/null && pwd) || { echo "run_nccl_tests: no folder $1" >&2; exit 2; }
build=$(cd "$2" 2> /dev/null && pwd) || { echo "run_nccl_tests: no folder $2" >&2; exit 2; }
out=${3:-${OUT:-$PWD/nccl-tests-out}}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
lib="$build/nccl/libmaco_nccl.so"
[ -e "$lib" ] || { echo "run_nccl_tests: $lib is missing (build MACO with -DMACO_BUILD_NCCL=ON)" >&2; exit 2; }
[ -e "$tests_dir/src/common.cu" ] || { echo "run_nccl_tests: $tests_dir is not an nccl-tests checkout (no src/common.cu)" >&2; exit 2; }

if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc > /dev/null; then
    CUDA_HOME=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
  else
    CUDA_HOME=/usr/local/cuda
  fi
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "run_nccl_tests: no nvcc in $CUDA_HOME/bin (set CUDA_HOME)" >&2; exit 2; }
inc=${NCCL_INC:-}
if [ -z "$inc" ]; then
  inc=$CUDA_HOME/include
  [ -e "$HOME/.cache/maco/nccl-2.32.6/include/nccl.h" ] && inc=$HOME/.cache/maco/nccl-2.32.6/include
fi
[ -e "$inc/nccl.h" ] || { echo "run_nccl_tests: no nccl.h in $inc (set NCCL_INC)" >&2; exit 2; }
code=$(sed -n 's/^#define NCCL_VERSION_CODE *\([0-9]*\).*/\1/p' "$inc/nccl.h")
if [ "$code" != "23206" ]; then
  echo "run_nccl_tests: note: $inc/nccl.h is NCCL_VERSION_CODE '$code', not 23206 (MACO's library is built from 2.32.6's and keeps 2.28.9's ABI: docs/nccl.md)" >&2
fi

# NCCL_HOME for the Makefile: the headers, and MACO's library under NCCL's names.
home="$out/nccl_home"
rm -rf "$home"
mkdir -p "$home/include" "$home/lib"
for h in "$inc"/nccl*; do
  ln -s "$h" "$home/include/"
done
ln -s "$lib" "$home/lib/libnccl.so"
ln -s "$lib" "$home/lib/libnccl.so.2"

# GPUs: CUDA_VISIBLE_DEVICES narrows what nvidia-smi lists.
ngpus=${NGPUS:-}
if [ -z "$ngpus" ]; then
  ngpus=0
  command -v nvidia-smi > /dev/null && ngpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    vis=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$vis" -lt "$ngpus" ] && ngpus=$vis
  fi
fi
gencode=""
if command -v nvidia-smi > /dev/null; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d ' .')
  [ -n "$cc" ] && gencode="-gencode=arch=compute_$cc,code=sm_$cc"
fi

# The test names: the Makefile's BIN_FILES_LIST as make sees it (continuation lines and
# includes resolved), else every src/*.cu that is not a helper.
names=$(make -C "$tests_dir/src" -pn NCCL_HOME="$home" CUDA_HOME="$CUDA_HOME" BUILDDIR=/nonexistent \
  2> /dev/null | sed -n 's/^BIN_FILES_LIST *:*= *//p' | head -1)
if [ -z "$names" ]; then
  for f in "$tests_dir"/src/*.cu; do
    b=$(basename "$f" .cu)
    case "$b" in common | util | timer) ;; *) names="$names $b" ;; esac
  done
fi
if [ -n "${NCCL_TESTS_ONLY:-}" ]; then
  keep=""
  for n in $names; do
    for o in $NCCL_TESTS_ONLY; do [ "$n" = "$o" ] && keep="$keep $n"; done
  done
  names=$keep
fi

make_args=(-k -j "$(nproc)" NCCL_HOME="$home" CUDA_HOME="$CUDA_HOME")
[ -n "$gencode" ] && make_args+=(NVCC_GENCODE="$gencode")
echo "run_nccl_tests: building nccl-tests from $tests_dir against $inc/nccl.h ($code) and $lib"
make -C "$tests_dir" "${make_args[@]}" BUILDDIR="$out/build" > "$out/build.log" 2>&1
echo "run_nccl_tests: build log: $out/build.log"
unbuilt="" built=0
for n in $names; do
  if [ -x "$out/build/${n}_perf" ]; then built=$((built + 1)); else unbuilt="$unbuilt ${n}_perf"; fi
done
if [ "$built" -eq 0 ]; then
  echo "run_nccl_tests: no test built (of:$unbuilt); see $out/build.log:" >&2
  grep -m 5 -i "error" "$out/build.log" >&2
  exit 2
fi

mpi_note=""
have_mpi=0
if command -v mpirun > /dev/null && command -v mpicc > /dev/null; then
  have_mpi=1
  mpi_home=$(cd "$(dirname "$(command -v mpicc)")/.." && pwd)
  echo "run_nccl_tests: building MPI=1 (MPI_HOME=$mpi_home)"
  make -C "$tests_dir" "${make_args[@]}" MPI=1 MPI_HOME="$mpi_home" BUILDDIR="$out/build-mpi" \
    > "$out/build-mpi.log" 2>&1
else
  missing=""
  command -v mpirun > /dev/null || missing="mpirun"
  command -v mpicc > /dev/null || missing="${missing:+$missing and }mpicc"
  mpi_note="one process per GPU (MPI=1 build, mpirun -np $ngpus ... -g 1) skipped: no $missing on PATH"
fi

if [ "$ngpus" -lt 1 ]; then
  echo "run_nccl_tests: no GPU visible (nvidia-smi -L lists none): built, nothing run"
  [ -n "$unbuilt" ] && echo "did not build:$unbuilt (see $out/build.log)"
  exit 77
fi

# The tests' environment, set on each test process only (not on timeout or mpirun).
tenv=(env "LD_PRELOAD=$lib${LD_PRELOAD:+:$LD_PRELOAD}"
  "LD_LIBRARY_PATH=$build/nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "MACO_DEVICE_TIMEOUT=${MACO_DEVICE_TIMEOUT:-30s}" MACO_LOG_LEVEL=info MACO_LOG_SUBSYS=coll
  NCCL_NVLS_ENABLE=0)
limit=${NCCL_TESTS_TIMEOUT:-180}
# NVIDIA's NCCL to rerun a failing run on (run() below); none: failures stay failures.
ref=${NCCL_REFERENCE:-}
if [ -z "$ref" ]; then
  for c in /lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
    [ -e "$c" ] && ref=$c && break
  done
fi
base=(-b 8 -e 64M -f 4 -c 1 -w 2 -n 5)
summary="$out/summary.txt"
: > "$summary"
failed=0

# parse, fallback, values_wrong and racy: how a run's log is judged (tested on the CPU by
# tests/nccl/test_nccl_tests_verdict.sh against real logs).
# shellcheck source=tests/nccl/nccl_tests_verdict.sh
. "$here/nccl_tests_verdict.sh"

# run NAME LOGTAG LAUNCHER... : one run, its log and its summary line.
run() {
  local name=$1 tag=$2
  shift 2
  local log="$out/${name}_${tag}.log" rc
  echo "+ $*" > "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  read -r wrong oob bw <<< "$(parse "$log")"
  local fb verdict=PASS why=""
  fb=$(fallback "$log")
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why=" (killed after ${limit} s)"
  elif [ "$rc" -ne 0 ]; then
    why=" (exit $rc)"
  elif [ "$oob" != "0" ]; then
    why=" (no \"Out of bounds values : 0 OK\")"
  elif [ "$wrong" != "0" ]; then
    why=" (#wrong)"
  fi
  [ -n "$why" ] && verdict=FAIL
  # A run whose only fault on MACO is wrong values runs again on the reference NCCL: when
  # NCCL reports wrong values too (not killed), the run is SAME (the test itself is wrong
  # there) and does not fail the script. Any other failure (killed, an error exit without
  # wrong values, a log that does not parse, a fallback) stays FAIL whatever NCCL does; a test
  # that races with these arguments (racy) is RACE below, whatever NCCL gave.
  if [ "$verdict" = FAIL ] && [ -n "$ref" ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] &&
    [ "$fb" = none ] && values_wrong "$wrong" "$oob"; then
    local a refcmd=()
    for a in "$@"; do
      case "$a" in
      LD_PRELOAD=*) refcmd+=("LD_PRELOAD=$ref") ;;
      LD_LIBRARY_PATH=*) refcmd+=("LD_LIBRARY_PATH=$(dirname "$ref")") ;;
      *) refcmd+=("$a") ;;
      esac
    done
    local rlog="$out/${name}_${tag}.nccl.log" rrc rw ro
    echo "+ ${refcmd[*]}" > "$rlog"
    timeout -k 10 "$limit" "${refcmd[@]}" >> "$rlog" 2>&1
    rrc=$?
    read -r rw ro _ <<< "$(parse "$rlog")"
    if [ "$rrc" -ne 124 ] && [ "$rrc" -ne 137 ] && values_wrong "$rw" "$ro"; then
      verdict=SAME
      why="$why; fails on $ref too (exit $rrc, wrong=$rw oob=$ro: $(basename "$rlog"))"
    else
      why="$why; passes on $ref (wrong=$rw)"
    fi
  fi
  if [ "$verdict" != PASS ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$fb" = none ] &&
    values_wrong "$wrong" "$oob" && racy "$name" "$@"; then
    verdict=RACE why="$why; this test races with these arguments (see the header)"
  fi
  [ "$verdict" = FAIL ] && failed=$((failed + 1))
  local line
  line=$(printf '%-4s  %-20s %-28s wrong=%s oob=%s busbw=%s fallback=%s%s' "$verdict" "$name" "$tag" \
    "$wrong" "$oob" "$bw" "$fb" "$why")
  echo "$line" | tee -a "$summary"
  if [ "$verdict" = FAIL ]; then
    grep -m 3 -E "ERROR|WARN|error|failed" "$log" | sed 's/^/        /'
  fi
}

gcounts=""
g=1
while [ "$g" -le "$ngpus" ]; do
  gcounts="$gcounts $g"
  g=$((g * 2))
done
case " $gcounts " in *" $ngpus "*) ;; *) gcounts="$gcounts $ngpus" ;; esac
start=$(date +%s)
echo "run_nccl_tests: $ngpus GPU(s), runs of up to $limit s each; logs in $out"
for n in $names; do
  bin="$out/build/${n}_perf"
  [ -x "$bin" ] || continue
  reducing=0
  case "$n" in all_reduce | reduce | reduce_scatter) reducing=1 ;; esac
  for g in $gcounts; do
    run "${n}_perf" "g${g}_R0" "${tenv[@]}" "$bin" "${base[@]}" -g "$g" -R 0
  done
  if [ "$ngpus" -ge 2 ]; then
    half=$((ngpus / 2))
    run "${n}_perf" "t2_g${half}" "${tenv[@]}" "$bin" "${base[@]}" -t 2 -g "$half"
  fi
  run "${n}_perf" "g${ngpus}_R1" "${tenv[@]}" "$bin" "${base[@]}" -g "$ngpus" -R 1
  run "${n}_perf" "g${ngpus}_R2" "${tenv[@]}" "$bin" "${base[@]}" -g "$ngpus" -R 2
  run "${n}_perf" "g${ngpus}_G5" "${tenv[@]}" "$bin" "${base[@]}" -g "$ngpus" -G 5
  if [ "$reducing" -eq 1 ]; then
    run "${n}_perf" "g${ngpus}_dall_oall" "${tenv[@]}" "$bin" -b 8 -e 1M -f 8 -c 1 -w 1 -n 2 -g "$ngpus" -d all -o all
  else
    run "${n}_perf" "g${ngpus}_dall" "${tenv[@]}" "$bin" -b 8 -e 1M -f 8 -c 1 -w 1 -n 2 -g "$ngpus" -d all
  fi
  if [ "$have_mpi" -eq 1 ] && [ -x "$out/build-mpi/${n}_perf" ]; then
    mpi=(mpirun -np "$ngpus")
    mpirun --version 2>&1 | grep -qi "open mpi" && mpi+=(--allow-run-as-root --oversubscribe)
    run "${n}_perf" "mpi${ngpus}_g1" "${mpi[@]}" "${tenv[@]}" "$out/build-mpi/${n}_perf" \
      "${base[@]}" -g 1
  fi
done

echo
echo "run_nccl_tests: summary ($(($(date +%s) - start)) s of runs; logs in $out):"
cat "$summary"
if [ -n "$unbuilt" ]; then
  echo "did not build:$unbuilt (see $out/build.log; alltoall_perf needs NCCL 2.29's device API, expected against a 2.28 header)" | tee -a "$summary"
fi
[ -n "$mpi_note" ] && echo "$mpi_note" | tee -a "$summary"
if [ "$have_mpi" -eq 1 ]; then
  for n in $names; do
    [ -x "$out/build-mpi/${n}_perf" ] || echo "MPI=1 build of ${n}_perf missing (see $out/build-mpi.log)" | tee -a "$summary"
  done
fi
[ "$failed" -eq 0 ] || { echo "run_nccl_tests: $failed run(s) failed"; exit 1; }
echo "run_nccl_tests: every run passed"
exit 0
