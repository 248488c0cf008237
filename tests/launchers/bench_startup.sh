#!/usr/bin/env bash
# Start-up time of a MACO job, from the launcher's command to a ready communicator on every
# rank (tests/bench_startup.c), under maco-run, mpirun (the id through PMIx), srun --mpi=pmix
# and srun with a nonce (a one-host Slurm started here, tests/launchers/slurm_cluster.sh).
# A benchmark, not a test: prints a table (the median of RUNS runs per cell, default 3) that
# docs/performance.md quotes, with the machine and the date.
#
#   tests/launchers/bench_startup.sh BUILD_DIR [RANKS...]      (default ranks: 4 16 64)
#
# Launchers that are not installed (or srun without root) are left out, saying so.
set -uo pipefail
B=$(realpath "${1:?usage: bench_startup.sh BUILD_DIR [RANKS...]}")
shift
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(4 16 64)
runs=${RUNS:-3}
here=$(cd "$(dirname "$0")" && pwd)
P=$B/tests/bench_startup
[ -x "$P" ] || { echo "bench_startup.sh: $P is not built"; exit 1; }
tmp=$(mktemp -d /tmp/maco-bench-startup.XXXXXX)
. "$here/slurm_cluster.sh"
trap 'stop_slurm "$tmp"; rm -rf "$tmp"' EXIT INT TERM

mpi=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
launchers=(maco-run)
command -v mpirun >/dev/null && launchers+=(mpirun) || echo "note: no mpirun; left out"
if why=$(slurm_prerequisites) && start_slurm "$tmp" > "$tmp/start.log" 2>&1; then
  timeout 60 srun -n 1 --mpi=pmix true >/dev/null 2>&1 && launchers+=(srun-pmix) ||
    echo "note: srun --mpi=pmix does not run here; left out"
  launchers+=(srun-nonce)
else
  echo "note: no Slurm cluster (${why:-$(tail -n 3 "$tmp/start.log")}); srun left out"
fi

# one LAUNCHER N: one run; prints the launch-to-ready and main-to-ready seconds.
one() {
  local cmd
  case $1 in
    maco-run) cmd=("$B/tools/maco-run" -n "$2" --timeout 300 "$P") ;;
    mpirun) cmd=("${mpi[@]}" -n "$2" "$P") ;;
    srun-pmix) cmd=(srun -n "$2" --mpi=pmix "$P") ;;
    srun-nonce) cmd=(env MACO_BOOTSTRAP_NONCE="$(od -An -N8 -tx8 /dev/urandom | tr -d ' \n')" srun -n "$2" "$P") ;;
  esac
  BENCH_LAUNCH_NS=$(date +%s%N) timeout 300 "${cmd[@]}" 2>&1 |
    sed -n 's/.*launch to ready \([0-9.]*\) s, main to ready \([0-9.]*\) s.*/\1 \2/p'
}

median() { sort -n | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "-"}'; }

printf '| launcher | id by |'; for n in "${sizes[@]}"; do printf ' %s ranks |' "$n"; done; echo
printf '| --- | --- |'; for _ in "${sizes[@]}"; do printf ' --- |'; done; echo
for l in "${launchers[@]}"; do
  case $l in maco-run) by=address ;; mpirun | srun-pmix) by=pmix ;; srun-nonce) by=slurm-nodelist ;; esac
  printf '| %s | %s |' "$l" "$by"
  for n in "${sizes[@]}"; do
    : > "$tmp/cell"
    for _ in $(seq "$runs"); do one "$l" "$n" >> "$tmp/cell"; done
    if [ -s "$tmp/cell" ]; then
      printf ' %s s (MACO %s s) |' "$(cut -d' ' -f1 "$tmp/cell" | median)" "$(cut -d' ' -f2 "$tmp/cell" | median)"
    else
      printf ' failed |'
    fi
  done
  echo
done
echo "(median of $runs runs: launch to ready on the slowest rank; in brackets, main() to ready)"
