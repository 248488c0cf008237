#!/usr/bin/env bash
# Harness check and perftest baseline: ib_write_bw (1, 4, 16, 64 MiB) and ib_write_lat (8 B) over
# soft-RoCE in one VM (server and client on rxe0) and across two VMs (VM 0 server, VM 1 client).
#   usage: selftest.sh [--vms 1|2|both] [--log-dir DIR] [--timeout S]
#   PERF_BW / PERF_LAT ("SIZE:ITERS ...") change the sizes and iteration counts (guest/perftest.sh).
# Exit 0 when every run passed, else the first failing run.sh status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
which=both logdir='' tmo=900
while [ $# -gt 0 ]; do
  case $1 in
    --vms) which=$2; shift 2;;
    --log-dir) logdir=$2; shift 2;;
    --timeout) tmo=$2; shift 2;;
    *) sed -n '2,6p' "$0" >&2; exit 2;;
  esac
done
"$here/setup.sh" || exit 125
keep=$logdir; [ -n "$logdir" ] || logdir=$(mktemp -d "${TMPDIR:-/tmp}/ibvm-selftest.XXXXXX")
mkdir -p "$logdir"
envs=(); for v in PERF_BW PERF_LAT; do [ -n "${!v:-}" ] && envs+=(--env "$v"); done
case $which in 1) list="1";; 2) list="2";; both) list="1 2";; *) echo "--vms 1|2|both" >&2; exit 2;; esac

T0=$(ibvm_ms)
# One image for both runs.
"$here/build-initramfs.sh" "$logdir/base.cpio.gz" 2>"$logdir/build.err" || { cat "$logdir/build.err" >&2; exit 125; }
status=0 summary=()
for n in $list; do
  t=$(ibvm_ms)
  "$here/run.sh" --vms "$n" --script "$here/guest/perftest.sh" --initramfs "$logdir/base.cpio.gz" \
    --timeout "$tmo" --log-dir "$logdir/vms$n" "${envs[@]}" 2> >(tee "$logdir/run$n.err" >&2)
  rc=$?
  wall=$(( $(ibvm_ms) - t ))
  sleep 0.2   # let the stderr tee finish
  [ $rc = 0 ] || { [ $status = 0 ] && status=$rc; }
  start=$(grep -h -o 'guest uptime [0-9.]* s' "$logdir/run$n.err" | awk '{print $3}' | sort -n | tail -1)
  summary+=("$n VM(s): rc=$rc, wall $((wall / 1000)).$(( wall % 1000 / 100 )) s, guest script started at uptime ${start:-?} s")
  while read -r line; do
    kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }   # the value of KEY=VALUE in line
    case $(kv test) in
      write_bw)  summary+=("$(printf '  ib_write_bw  %9s B x %-3s avg %8s MB/s  peak %8s MB/s' "$(kv bytes)" "$(kv iters)" "$(kv bw_avg_MBps)" "$(kv bw_peak_MBps)")");;
      write_lat) summary+=("$(printf '  ib_write_lat %9s B x %-4s typical %s us  avg %s us  min %s us  p99 %s us' "$(kv bytes)" "$(kv iters)" "$(kv t_typical_us)" "$(kv t_avg_us)" "$(kv t_min_us)" "$(kv t_p99_us)")");;
    esac
  done < <(cat "$logdir/vms$n"/vm*.log 2>/dev/null | grep -a '^IBVM-PERF ')
  while read -r line; do summary+=("  rxe counters: ${line#IBVM-COUNTERS }"); done < <(cat "$logdir/vms$n"/vm*.log 2>/dev/null | grep -a '^IBVM-COUNTERS ')
done
echo
echo "== selftest summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, kernel $(cat "$IBVM_CACHE/kernel/current"), total $(( ($(ibvm_ms) - T0) / 1000 )) s)"
printf '%s\n' "${summary[@]}"
[ -n "$keep" ] && echo "logs in $logdir" || rm -rf "$logdir"
exit $status
