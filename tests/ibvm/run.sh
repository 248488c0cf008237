#!/usr/bin/env bash
# Boots one test VM, or two joined by a virtual wire, with soft-RoCE (rxe0) up, runs a guest
# script in each and exits with the guests' failure count.
#
#   run.sh [options] --script GUEST.sh [-- ARGS...]
#     --script FILE     script to run in each VM (with ARGS); its exit status is its failure count
#     --vms N           1 (default) or 2
#     --pack PATH       host file or folder to put in the VM at the same absolute path, with the
#                       shared libraries of every ELF file in it (repeatable)
#     --initramfs FILE  a base image from build-initramfs.sh to use instead of building one
#                       (then --pack is not allowed: pack when building it)
#     --env NAME=VALUE  exported to the guest script (repeatable); --env NAME passes the host's value
#     --share DIR       host folder mounted read-write (9p) at the same path in the VM(s)
#     --timeout S       wall-clock limit for the whole run (default 300, or IBVM_TIMEOUT)
#     --mem MB          RAM per VM (default 1024 for one VM, 768 each for two)
#     --smp N           vCPUs per VM (default 2 for one VM, 1 each for two)
#     --log-dir DIR     keep the consoles as DIR/vm0.log (and DIR/vm1.log)
#     --quiet           do not print the consoles, only the summary
#     --wire udp|unix   how two VMs are joined (default udp, or IBVM_WIRE): a qemu UDP socket
#                       netdev on 127.0.0.1, or a qemu stream netdev over a Unix socket in the
#                       run's temp folder (lossless, no IP at all on the host)
#   IBVM_ACCEL=tcg|kvm|auto (default auto: kvm only where it really boots, else tcg).
#
# In the guest the script runs as root in /tmp with (see README.md):
#   IBVM_INDEX (0 or 1)  IBVM_NVMS (1 or 2)  IBVM_ROLE (single, server = VM 0, client = VM 1)
#   IBVM_IP (10.13.0.1 for VM 0, 10.13.0.2 for VM 1)  IBVM_PEER_IP  IBVM_SERVER_IP (10.13.0.1)
#   IBVM_DEV (rxe0)  IBVM_NETDEV (dummy0 or eth0)  IBVM_GID_INDEX  IBVM_GID  IBVM_SHARE
# and can `. /ibvm/lib.sh` for ibvm_retry, ibvm_barrier, ibvm_wait_tcp.
#
# Exit: 0 pass; 1..122 the summed failure count (122 meaning 122 or more) (setup steps that failed + script exit
# statuses); 125 when a VM never reported (timeout, panic, qemu error) or on a usage error;
# 123 when a VM's kernel reported its virtual NIC stuck (virtio-net "NETDEV WATCHDOG: transmit
# queue timed out": qemu stopped draining the guest's TX ring, so no packet leaves that VM and
# nothing above it can recover). The VMs are then stopped at once rather than left to run out
# the clock, and the line "ibvm: wire stall" says so; the run says nothing about the code under
# test. (Seen with qemu 7.2 under TCG on both wires: README.md, docs/performance.md.)
set -uo pipefail
. "$(dirname "$0")/common.sh"
usage() { sed -n '2,31p' "$0" >&2; exit 125; }

nvms=1 script='' initrd='' share='' tmo=${IBVM_TIMEOUT:-300} mem='' smp='' logdir='' quiet=0
wire=${IBVM_WIRE:-udp}
packs=() envs=()
while [ $# -gt 0 ]; do
  case $1 in
    --script) script=${2:?}; shift 2;;
    --vms) nvms=${2:?}; shift 2;;
    --pack) packs+=("${2:?}"); shift 2;;
    --initramfs) initrd=${2:?}; shift 2;;
    --env) envs+=("${2:?}"); shift 2;;
    --share) share=${2:?}; shift 2;;
    --timeout) tmo=${2:?}; shift 2;;
    --mem) mem=${2:?}; shift 2;;
    --smp) smp=${2:?}; shift 2;;
    --log-dir) logdir=${2:?}; shift 2;;
    --quiet) quiet=1; shift;;
    --wire) wire=${2:?}; shift 2;;
    --) shift; break;;
    -h|--help) usage;;
    *) echo "run.sh: unknown argument $1" >&2; usage;;
  esac
done
[ -n "$script" ] && [ -f "$script" ] || { echo "run.sh: --script FILE is required" >&2; usage; }
case $nvms in 1|2) ;; *) echo "run.sh: --vms must be 1 or 2" >&2; exit 125;; esac
[ -z "$initrd" ] || [ ${#packs[@]} -eq 0 ] || { echo "run.sh: --pack goes to build-initramfs.sh when --initramfs is given" >&2; exit 125; }
case $wire in udp|unix) ;; *) echo "run.sh: --wire must be udp or unix" >&2; exit 125;; esac
[ -z "$share" ] || [ -d "$share" ] || { echo "run.sh: --share $share is not a folder" >&2; exit 125; }
[ "$nvms" = 1 ] && { : "${mem:=1024}" "${smp:=2}"; } || { : "${mem:=768}" "${smp:=1}"; }
command -v qemu-system-x86_64 >/dev/null || { ibvm_log "qemu-system-x86_64 not installed (run setup.sh)"; exit 125; }
ibvm_kernel || { ibvm_log "no kernel in $IBVM_CACHE (run setup.sh)"; exit 125; }

T0=$(ibvm_ms)
W=$(mktemp -d "${TMPDIR:-/tmp}/ibvm-run.XXXXXX")
pids=()
cleanup() {
  local f p n
  for f in "$W"/vm*.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null) || continue
    [ -n "$p" ] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = qemu-system-x86 ] || continue
    kill -TERM "$p" 2>/dev/null
    for n in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null
  done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
trap 'ibvm_log "interrupted"; exit 125' INT TERM HUP

# The base image (unless given) and a small second archive with the script, its arguments and
# environment; the kernel unpacks concatenated archives one over the other.
if [ -z "$initrd" ]; then
  initrd=$W/base.cpio.gz
  "$IBVM_DIR/build-initramfs.sh" "$initrd" "${packs[@]}" || { ibvm_log "initramfs build failed"; exit 125; }
fi
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }   # quote for the guest's sh
mkdir -p "$W/ov/ibvm"
cp "$script" "$W/ov/ibvm/guest-script"; chmod 755 "$W/ov/ibvm/guest-script"
: > "$W/ov/ibvm/args"; for a in "$@"; do printf '%s ' "$(q "$a")" >> "$W/ov/ibvm/args"; done
: > "$W/ov/ibvm/env"
for e in "${envs[@]}"; do
  n=${e%%=*}; [[ $n =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { ibvm_log "bad --env $e"; exit 125; }
  if [[ $e == *=* ]]; then v=${e#*=}; else v=${!n-}; fi
  echo "export $n=$(q "$v")" >> "$W/ov/ibvm/env"
done
[ -n "$share" ] && realpath "$share" > "$W/ov/ibvm/share"
(cd "$W/ov" && find . -print0 | cpio -o -0 -H newc --quiet -R 0:0 | gzip -1) > "$W/overlay.cpio.gz"
cat "$initrd" "$W/overlay.cpio.gz" > "$W/initrd.img"

# Accelerator: KVM only where it is real hardware virtualisation and a guest kernel actually
# boots on it (a PVM host has /dev/kvm but cannot run a stock kernel); the answer is cached.
accel=${IBVM_ACCEL:-auto}
if [ "$accel" = auto ]; then
  accel=tcg
  if [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
    probe=$IBVM_CACHE/accel-$(hostname)-$KVER
    if [ ! -f "$probe" ]; then
      if timeout -k 2 20 qemu-system-x86_64 -accel kvm -cpu host -m 256 -nodefaults -display none \
           -serial stdio -no-reboot -kernel "$KIMAGE" -append "console=ttyS0 panic=-1" </dev/null 2>/dev/null |
         grep -q -m1 'Linux version'; then echo kvm > "$probe"; else echo tcg > "$probe"; fi
    fi
    accel=$(cat "$probe")
  fi
fi
case $accel in
  kvm) A=(-accel kvm -cpu host);;
  tcg) A=(-accel "tcg,thread=multi" -cpu max);;
  *) ibvm_log "IBVM_ACCEL must be tcg, kvm or auto"; exit 125;;
esac

# Two VMs: a point-to-point UDP socket netdev on 127.0.0.1 (nothing else reachable), or a
# stream netdev over a Unix socket.
ports=()
if [ "$nvms" = 2 ] && [ "$wire" = udp ]; then
  for _ in $(seq 1 50); do
    p=$(( 30000 + (RANDOM % 14000) * 2 ))
    [ -z "$(ss -Hauln "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null)" ] && { ports=("$p" "$((p + 1))"); break; }
  done
  [ ${#ports[@]} = 2 ] || { ibvm_log "no free UDP port pair on 127.0.0.1"; exit 125; }
fi

[ -n "$logdir" ] && mkdir -p "$logdir"
if [ $quiet = 1 ]; then exec 3>/dev/null; else exec 3>&1; fi   # (not >/dev/stdout: that reopens a file at offset 0)
ibvm_log "booting $nvms VM(s): accel=$accel$([ "$nvms" = 2 ] && echo " wire=$wire") smp=$smp mem=${mem}M kernel=$KVER timeout=${tmo}s (prepared in $(( $(ibvm_ms) - T0 )) ms)"
TB=$(ibvm_ms)
for i in $(seq 0 $((nvms - 1))); do
  net=(-nic none)
  if [ "$nvms" = 2 ] && [ "$wire" = udp ]; then
    net=(-netdev "socket,id=n0,udp=127.0.0.1:${ports[$((1 - i))]},localaddr=127.0.0.1:${ports[$i]}")
  elif [ "$nvms" = 2 ]; then
    net=(-netdev "stream,id=n0,server=$([ $i = 0 ] && echo on || echo off),addr.type=unix,addr.path=$W/wire.sock")
    # VM 1 connects to VM 0's socket: wait until VM 0's qemu has created it.
    if [ $i = 1 ]; then
      for n in $(seq 1 100); do [ -S "$W/wire.sock" ] && break; sleep 0.1; done
    fi
  fi
  [ "$nvms" = 2 ] && net+=(-device "virtio-net-pci,netdev=n0,mac=52:54:00:13:00:0$((i + 1))")
  v=()
  [ -n "$share" ] && v=(-virtfs "local,path=$(realpath "$share"),mount_tag=ibvmshare,security_model=none,id=share")
  log=${logdir:+$logdir/vm$i.log}; log=${log:-$W/vm$i.log}
  # timeout bounds the run; pdeathsig takes qemu down with timeout should anything kill that.
  ( timeout -k 5 "$tmo" setpriv --pdeathsig KILL \
      qemu-system-x86_64 "${A[@]}" -smp "$smp" -m "$mem" -nodefaults -display none -serial stdio \
      -monitor none -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=0x04 "${net[@]}" "${v[@]}" \
      -pidfile "$W/vm$i.pid" -kernel "$KIMAGE" -initrd "$W/initrd.img" \
      -append "console=ttyS0 quiet panic=-1 ibvm.index=$i ibvm.nvms=$nvms" </dev/null 2>&1
    echo $? > "$W/vm$i.rc"
  ) 2>/dev/null | sed -u 's/\r$//' | tee "$log" | sed -u "s/^/[vm$i] /" >&3 &
  pids+=($!)
done
# Watch the consoles for the guest kernel's TX watchdog; on it, stop every VM (the wire is dead).
( while sleep 1; do
    for i in $(seq 0 $((nvms - 1))); do
      log=${logdir:+$logdir/vm$i.log}; log=${log:-$W/vm$i.log}
      if grep -aq 'NETDEV WATCHDOG' "$log" 2>/dev/null; then
        echo "$i" > "$W/wire-stall"
        for f in "$W"/vm*.pid; do p=$(cat "$f" 2>/dev/null) && [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done
        exit 0
      fi
    done
  done ) &
mon=$!
wait "${pids[@]}"
pids=()
kill "$mon" 2>/dev/null; wait "$mon" 2>/dev/null
wall=$(( $(ibvm_ms) - TB ))

total=0 bad=0
for i in $(seq 0 $((nvms - 1))); do
  log=${logdir:+$logdir/vm$i.log}; log=${log:-$W/vm$i.log}
  rc=$(cat "$W/vm$i.rc" 2>/dev/null || echo none)
  res=$(grep -a -m1 "^IBVM: RESULT index=$i " "$log" | sed -n 's/.* failures=\([0-9]*\).*/\1/p')
  up=$(grep -a -m1 '^IBVM: guest script start' "$log" | sed -n 's/.*uptime=\([0-9.]*\).*/\1/p')
  if [ "$rc" != none ] && [ $((rc & 1)) = 1 ] && [ -n "$res" ]; then
    f=$((rc >> 1)); total=$((total + f))
    ibvm_log "vm$i: failures=$res (script started at guest uptime ${up:-?} s)"
  else
    bad=1
    case $rc in
      124|137) why="timed out after ${tmo} s"; [ -f "$W/wire-stall" ] && why="stopped for the wire stall";;
      none) why="no exit status";;
      *) why="qemu exit $rc, no result reported";;
    esac
    ibvm_log "vm$i: $why; last console lines:"
    tail -n 15 "$log" | sed "s/^/ibvm:   [vm$i] /" >&2
  fi
done
ibvm_log "wall ${wall} ms boot-to-result, $(( $(ibvm_ms) - T0 )) ms in all"
if [ -f "$W/wire-stall" ]; then
  ibvm_log "wire stall: vm$(cat "$W/wire-stall")'s virtio-net transmit queue stopped (NETDEV WATCHDOG); VMs stopped, this run tested nothing"
  exit 123
fi
[ $bad = 1 ] && exit 125
[ $total -gt 122 ] && total=122
exit $total
