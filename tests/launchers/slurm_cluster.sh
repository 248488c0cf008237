# A one-host Slurm cluster for the launcher tests and the start-up benchmark (sourced by
# tests/launchers/run.sh and bench_startup.sh): munged, slurmctld and slurmd from Debian's
# packages, with the configuration, state, logs and munge key in folder DIR, on free ports.
#   slurm_prerequisites          prints what is missing (and returns 1), else nothing
#   start_slurm DIR              starts it and exports SLURM_CONF; returns 1 (saying why) on failure
#   stop_slurm DIR               stops what start_slurm started (by the pids it recorded)
# Needs root (slurmd, SlurmUser=root). The node declares 64 CPUs (SlurmdParameters=
# config_overrides) and the partition oversubscribes, so that srun -n 64 fits on 2 cores.

slurm_prerequisites() {
  if [ "$(id -u)" -ne 0 ]; then echo "the one-host Slurm cluster needs root (slurmd)"; return 1; fi
  local p
  for p in munged slurmctld slurmd srun sbatch scontrol sinfo python3; do
    if ! command -v $p >/dev/null; then
      echo "$p is not installed (Debian: munge slurmctld slurmd slurm-client; scripts/setup.sh installs them)"
      return 1
    fi
  done
}

slurm_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_slurm() {
  local d=$1 host
  host=$(hostname -s)
  dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 2>/dev/null && chmod 400 "$d/munge.key"
  chmod 711 "$d" # munged wants its socket's folder searchable
  munged --force --socket="$d/munge.sock" --key-file="$d/munge.key" --pid-file="$d/munged.pid" \
    --log-file="$d/munged.log" --seed-file="$d/munged.seed" || { echo "munged did not start"; return 1; }
  mkdir -p "$d/state" "$d/spool"
  cat > "$d/slurm.conf" <<EOF
ClusterName=maco$$
# Job ids (and so the ports plain srun's rank 0 derives from them) differ between clusters
# that run at the same time on this machine.
FirstJobId=$((RANDOM * 30 + 1))
SlurmctldHost=$host
SlurmctldPort=$(slurm_free_port)
SlurmdPort=$(slurm_free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
NodeName=$host CPUs=64 State=UNKNOWN
PartitionName=maco Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$d/slurm.conf
  if ! slurmctld -f "$SLURM_CONF" || ! slurmd -f "$SLURM_CONF"; then
    echo "slurmctld or slurmd did not start"; tail -n 20 "$d"/slurm*.log; return 1
  fi
  local _
  for _ in $(seq 100); do
    sinfo -h -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)' && return 0
    sleep 0.2
  done
  echo "the node did not become idle:"; sinfo; tail -n 20 "$d/slurmctld.log" "$d/slurmd.log"
  return 1
}

stop_slurm() {
  local d=$1 f p _
  [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ] && timeout 10 scontrol shutdown >/dev/null 2>&1
  for f in "$d/slurmctld.pid" "$d/slurmd.pid" "$d/munged.pid"; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; kill "$p" 2>/dev/null; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
  done
}
