#!/bin/bash
# Guest script for selftest.sh: perftest RDMA WRITE bandwidth and latency over rxe0, server and
# client in one VM (loopback through its own GID) or VM 0 = server, VM 1 = client.
# Prints one "IBVM-PERF ..." line per measurement (from the client side).
#   PERF_BW  "SIZE:ITERS ..." for ib_write_bw (default 1, 4, 16 and 64 MiB)
#   PERF_LAT "SIZE:ITERS ..." for ib_write_lat (default 8 bytes, 1000 iterations)
#   PERF_TIMEOUT  seconds per perftest process (default 120)
# Ends with the rxe error/retry counters that are not zero ("IBVM-COUNTERS ...").
. /ibvm/lib.sh
BW=${PERF_BW:-"1048576:20 4194304:10 16777216:5 67108864:5"}
LAT=${PERF_LAT:-"8:1000"}
fail=0
port=18600
opts=(-d "$IBVM_DEV" -x "$IBVM_GID_INDEX" -F)

# pair NAME SIZE ITERS PERFTEST-ARGS...: one server/client run on a fresh TCP port. The client
# starts only once the server listens (same VM: netstat; two VMs: a barrier after that).
pair() {
  local name=$1 size=$2 iters=$3; shift 3
  port=$((port + 1))
  local run=(timeout "${PERF_TIMEOUT:-120}" "$name" "${opts[@]}" -p "$port" -s "$size" -n "$iters" "$@")
  local out=/tmp/$name-$size.out t0 t1 rc=0 sp
  t0=$(ibvm_uptime)
  if [ "$IBVM_ROLE" != client ]; then
    "${run[@]}" > /tmp/srv.out 2>&1 & sp=$!
    ibvm_wait_listen $port 60 || { echo "$name server did not listen"; kill $sp 2>/dev/null; }
  fi
  [ "$IBVM_ROLE" = single ] || ibvm_barrier "$name-$port" 120 || echo "barrier $name-$port failed"
  if [ "$IBVM_ROLE" != server ]; then "${run[@]}" "$IBVM_SERVER_IP" > "$out" 2>&1 || rc=$?; fi
  if [ "$IBVM_ROLE" != client ]; then
    wait $sp || { echo "$name -s $size server failed:"; tail -n 20 /tmp/srv.out; fail=$((fail + 1)); }
  fi
  t1=$(ibvm_uptime)
  if [ $rc -ne 0 ]; then echo "$name -s $size -n $iters failed (rc=$rc):"; tail -n 20 "$out"; fail=$((fail + 1)); return; fi
  [ "$IBVM_ROLE" = server ] && return
  # the result row starts with the size and the iteration count
  local row; row=$(awk -v s="$size" '$1 == s && NF >= 4 {print; exit}' "$out")
  [ -n "$row" ] || { echo "no result row in:"; cat "$out"; fail=$((fail + 1)); return; }
  set -- $row
  case $name in
    ib_write_bw)  echo "IBVM-PERF vms=$IBVM_NVMS test=write_bw bytes=$1 iters=$2 bw_peak_MBps=$3 bw_avg_MBps=$4 msg_rate_Mpps=$5 secs=$(echo "$t1 - $t0" | bc)";;
    ib_write_lat) echo "IBVM-PERF vms=$IBVM_NVMS test=write_lat bytes=$1 iters=$2 t_min_us=$3 t_max_us=$4 t_typical_us=$5 t_avg_us=$6 t_stdev_us=$7 t_p99_us=$8 secs=$(echo "$t1 - $t0" | bc)";;
  esac
}

for sn in $BW;  do pair ib_write_bw  "${sn%%:*}" "${sn##*:}"; done
for sn in $LAT; do pair ib_write_lat "${sn%%:*}" "${sn##*:}"; done
c=; for f in /sys/class/infiniband/$IBVM_DEV/ports/1/hw_counters/*; do
  case ${f##*/} in sent_pkts|rcvd_pkts|lifespan) continue;; esac
  v=$(cat "$f"); [ "$v" = 0 ] || c="$c ${f##*/}=$v"
done
echo "IBVM-COUNTERS vms=$IBVM_NVMS index=$IBVM_INDEX sent_pkts=$(cat /sys/class/infiniband/$IBVM_DEV/ports/1/hw_counters/sent_pkts)${c:- (no errors, retries or drops)}"
exit $fail
