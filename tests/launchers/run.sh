#!/usr/bin/env bash
# MACO jobs started by real launchers, with nothing in between (docs/multi-node.md):
#
#   tests/launchers/run.sh BUILD_DIR mpirun|srun
#
# mpirun: Open MPI's mpirun (Debian's openmpi-bin, with the PMIx runtime libpmix2) starts
#   4 ranks of test_launcher_mp (the rank is mpirun's, the id came through PMIx, a stranger
#   with a guessed nonce is refused), the bootstrap suite, the port-channel suite over host
#   memory, the same over TCP between two simulated nodes (MACO_HOST_ID per app context), and
#   maco-perf --dry-run (each rank prints the job MACO sees); then the error a rank gives when
#   the PMIx library cannot be loaded.
# srun: a one-host Slurm cluster (slurmctld, slurmd and munged from Debian's packages), with its
#   configuration, state, logs and munge key in a temporary folder, on free ports, started
#   here and stopped on every way out; srun -n 4 --mpi=pmix runs the same suites (where the
#   packaged mpi/pmix plugin loads; else it says so and goes on), plain srun -n 4 runs them
#   with MACO_BOOTSTRAP_NONCE exported (rank 0 found on the step's first node), plain srun
#   without it must fail saying what to add, and sbatch runs the batch scripts of
#   docs/multi-node.md (tests/launchers/job-pmix.sbatch, job-nonce.sbatch) on this one node.
#
# Prints one line per check (ok or FAIL, seconds) and a summary; exits 0 when all passed,
# 1 on a failure, 77 (ctest's skip) naming what is missing: a package, root for slurmd.
# LAUNCHERS_REQUIRE=1 (CI, .ci/run) turns a missing prerequisite into a failure.
set -uo pipefail
B=$(realpath "${1:?usage: run.sh BUILD_DIR mpirun|srun}")
MODE=${2:?usage: run.sh BUILD_DIR mpirun|srun}
here=$(cd "$(dirname "$0")" && pwd)
T=$B/tests
PERF=$B/tools/maco-perf
tmp=$(mktemp -d /tmp/maco-launchers.XXXXXX)
fails=0 passes=0
t_start=$(date +%s)

skip() {
  if [ "${LAUNCHERS_REQUIRE:-0}" = 1 ]; then echo "FAIL (LAUNCHERS_REQUIRE=1): $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}

declare -A passed # check name -> 1 when it passed
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs_since() { local ms=$(( $(now_ms) - $1 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
ok() { passes=$((passes + 1)); passed[$1]=1; printf 'ok    %-30s %6s s%s\n' "$1" "$2" "${3:-}"; }
failed() { fails=$((fails + 1)); passed[$1]=0; printf 'FAIL  %-30s %6s s (%s); its last lines:\n' "$1" "$2" "$3"
  tail -n 30 "$tmp/$1.log" | sed 's/^/    /'; }

# check NAME TIMEOUT COMMAND...: runs the command (output in $tmp/NAME.log); ok when it exits 0.
check() {
  local name=$1 t=$2; shift 2
  local t0; t0=$(now_ms)
  timeout -k 5 "$t" "$@" > "$tmp/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then ok "$name" "$(secs_since "$t0")"; else failed "$name" "$(secs_since "$t0")" "exit $rc"; fi
}

# expect_lines NAME PATTERN...: every pattern (grep -E) is in the log of check NAME, which
# then fails if one is not.
expect_lines() {
  local name=$1; shift
  local p missing=0
  for p in "$@"; do
    grep -Eq -- "$p" "$tmp/$name.log" || { echo "    $name: no line matches '$p'"; missing=1; }
  done
  if [ $missing -ne 0 ] && [ "${passed[$name]:-0}" = 1 ]; then
    passed[$name]=0; passes=$((passes - 1)); fails=$((fails + 1)); echo "FAIL  $name (output)"
  fi
}

# expect_failure NAME TIMEOUT PATTERN COMMAND...: the command must fail (not time out) and
# print PATTERN.
expect_failure() {
  local name=$1 t=$2 pattern=$3; shift 3
  local t0; t0=$(now_ms)
  timeout -k 5 "$t" "$@" > "$tmp/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pattern" "$tmp/$name.log"; then
    ok "$name" "$(secs_since "$t0")" " (fails as it must)"
  else
    failed "$name" "$(secs_since "$t0")" "exit $rc; wanted a failure saying \"$pattern\""
  fi
}

for b in test_launcher_mp test_bootstrap_mp test_port_channel_mp; do
  [ -x "$T/$b" ] || { echo "run.sh: $T/$b is not built"; exit 1; }
done
host=$(hostname -s)
# Under AddressSanitizer (CI's build-asan) the leaks libpmix keeps until exit are not MACO's.
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
. "$here/slurm_cluster.sh"
nonce() { od -An -N8 -tx8 /dev/urandom | tr -d ' \n'; }
# Two simulated nodes: ranks 0-1 and 2-3 get their own MACO_HOST_ID (as maco-run
# --simulate-nodes does), so the port-channel suite runs TCP between them.
sim_env() { echo "MACO_HOST_ID=$host/simulated-node-$1 TEST_MACO_PORT_TRANSPORT=auto"; }

# ------------------------------------------------------------------ mpirun
run_mpirun() {
  command -v mpirun >/dev/null || skip "mpirun is not installed (Debian: openmpi-bin; scripts/setup.sh installs it)"
  ldconfig -p | grep 'libpmix\.so\.2 ' >/dev/null ||
    skip "the PMIx runtime libpmix.so.2 is not installed (Debian: libpmix2; scripts/setup.sh installs it)"
  local mpi=(mpirun --oversubscribe -x LSAN_OPTIONS)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  mpirun --version 2>&1 | head -n 1
  check mpirun-launcher 120 "${mpi[@]}" -n 4 -x TEST_LAUNCHER=ompi/pmix \
    -x TEST_LAUNCHER_RANK_VAR=OMPI_COMM_WORLD_RANK -x MACO_LOG_LEVEL=info "$T/test_launcher_mp"
  expect_lines mpirun-launcher "launcher ompi: rank 3 of 4, node 0 of 1, local rank 3 of 4" \
    "unique id through PMIx"
  check mpirun-bootstrap 120 "${mpi[@]}" -n 4 "$T/test_bootstrap_mp"
  check mpirun-port-host 120 "${mpi[@]}" -n 4 "$T/test_port_channel_mp"
  check mpirun-port-tcp-2-nodes 120 "${mpi[@]}" \
    -n 2 env $(sim_env 0) "$T/test_port_channel_mp" : -n 2 env $(sim_env 1) "$T/test_port_channel_mp"
  check mpirun-topology-2-nodes 120 "${mpi[@]}" \
    -n 2 env $(sim_env 0) "$T/test_bootstrap_mp" --gtest_filter='*Topology*' : \
    -n 2 env $(sim_env 1) "$T/test_bootstrap_mp" --gtest_filter='*Topology*'
  check mpirun-perf-dry-run 60 "${mpi[@]}" -n 4 "$PERF" allreduce -b 8 -e 1M -f 2 --dry-run
  expect_lines mpirun-perf-dry-run "job: launcher ompi, rank 0 of 4" "job: launcher ompi, rank 3 of 4" \
    "unique id by pmix"
  expect_failure mpirun-no-pmix-library 60 "MACO_PMIX_LIBRARY=/nonexistent/libpmix.so.2 could not be loaded" \
    "${mpi[@]}" -n 2 -x MACO_PMIX_LIBRARY=/nonexistent/libpmix.so.2 "$T/test_launcher_mp"
}

# ------------------------------------------------------------------ srun
run_srun() {
  trap 'stop_slurm "$tmp"; rm -rf "$tmp"' EXIT INT TERM
  slurm_missing=$(slurm_prerequisites) || skip "$slurm_missing"
  start_slurm "$tmp" || { fails=$((fails + 1)); return; }
  srun --version
  local tcp_cmd='export MACO_HOST_ID='"$host"'/simulated-node-$((SLURM_PROCID / 2)) TEST_MACO_PORT_TRANSPORT=auto; exec "$0" "$@"'
  # srun --mpi=pmix: Slurm's PMIx server carries the id.
  local pmix=0
  if timeout 60 srun -n 1 --mpi=pmix true > "$tmp/pmix-probe.log" 2>&1; then
    pmix=1
    check srun-pmix-launcher 120 env TEST_LAUNCHER=slurm/pmix TEST_LAUNCHER_RANK_VAR=SLURM_PROCID \
      MACO_LOG_LEVEL=info srun -n 4 --mpi=pmix "$T/test_launcher_mp"
    expect_lines srun-pmix-launcher "launcher slurm: rank 3 of 4, node 0 of 1, local rank 3 of 4" \
      "unique id through PMIx \(namespace slurm.pmix"
    check srun-pmix-bootstrap 120 srun -n 4 --mpi=pmix "$T/test_bootstrap_mp"
    check srun-pmix-port-host 120 srun -n 4 --mpi=pmix "$T/test_port_channel_mp"
    check srun-pmix-port-tcp-2-nodes 120 srun -n 4 --mpi=pmix sh -c "$tcp_cmd" "$T/test_port_channel_mp"
    check srun-pmix-perf-dry-run 60 srun -n 4 --mpi=pmix "$PERF" allreduce -b 8 -e 1M --dry-run
    expect_lines srun-pmix-perf-dry-run "job: launcher slurm, rank 3 of 4, local rank 3, node 0 of 1, unique id by pmix"
  else
    echo "note: srun --mpi=pmix does not run here, so its checks are left out: $(tail -n 2 "$tmp/pmix-probe.log" | tr '\n' ' ')"
    [ "${LAUNCHERS_REQUIRE:-0}" = 1 ] && fails=$((fails + 1))
  fi
  # Plain srun: the batch script exports the nonce; rank 0 is on the step's first node.
  export MACO_BOOTSTRAP_NONCE; MACO_BOOTSTRAP_NONCE=$(nonce)
  check srun-nonce-launcher 120 env TEST_LAUNCHER=slurm/slurm-nodelist TEST_LAUNCHER_RANK_VAR=SLURM_PROCID \
    srun -n 4 "$T/test_launcher_mp"
  check srun-nonce-bootstrap 120 srun -n 4 "$T/test_bootstrap_mp"
  check srun-nonce-port-tcp-2-nodes 120 srun -n 4 sh -c "$tcp_cmd" "$T/test_port_channel_mp"
  unset MACO_BOOTSTRAP_NONCE
  # Plain srun and no nonce: no store to carry the id, and the error says what to add.
  expect_failure srun-no-store 60 "srun --mpi=pmix" srun -n 2 "$T/test_launcher_mp"
  expect_lines srun-no-store "MACO_BOOTSTRAP_NONCE is not set and this Slurm step offers no PMIx server"
  # The batch scripts of docs/multi-node.md, on this one node (the command line's --nodes and
  # --ntasks replace the scripts' own).
  local s
  for s in pmix nonce; do
    [ $s = pmix ] && [ $pmix = 0 ] && continue
    check sbatch-$s 180 sbatch --wait --nodes 1 --ntasks 4 -o "$tmp/sbatch-$s.out" \
      "$here/job-$s.sbatch" "$T/test_launcher_mp"
    cat "$tmp/sbatch-$s.out" >> "$tmp/sbatch-$s.log"
    expect_lines sbatch-$s "launcher slurm, id by $([ $s = pmix ] && echo pmix || echo slurm-nodelist): ranks 0..3 each once"
  done
}

case $MODE in
  mpirun) trap 'rm -rf "$tmp"' EXIT INT TERM; run_mpirun ;;
  srun) run_srun ;;
  *) echo "run.sh: unknown mode '$MODE' (mpirun or srun)"; exit 2 ;;
esac
echo "launchers ($MODE): $passes passed, $fails failed in $(( $(date +%s) - t_start )) s"
[ $fails -eq 0 ]
