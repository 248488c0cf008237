#!/bin/bash
# Guest script: MACO port-channel puts over IB (tests/bench_port_host) next to perftest's
# ib_write_bw / ib_write_lat on the same rxe0, in one VM (2 ranks of maco-run) or across two
# (rank 0 in VM 0, rank 1 in VM 1, bootstrapped by hand). Also MACO over TCP for reference.
# Needs --pack BUILD/tests/bench_port_host (+ libmaco, maco-run), --pack of guest/perftest.sh,
# --env IBVM_BUILD=BUILD and --env IBVM_PERFTEST=that path.
#   BENCH_RUNS ("maco_ib perftest maco_tcp", the default) what runs, in that order
#   BENCH_ARGS (default "-b 1M -e 64M -f 4 -n 10 -l 1000": perftest's sizes) bench_port_host's
#   arguments
# Prints "IBVM-BENCH ..." lines; exit status: how many runs failed.
. /ibvm/lib.sh
B=${IBVM_BUILD:?--env IBVM_BUILD=the build folder}
X=$B/tests/bench_port_host
read -r -a args <<< "${BENCH_ARGS:--b 1M -e 64M -f 4 -n 10 -l 1000}"
fail=0
export MACO_LOG_LEVEL=${MACO_LOG_LEVEL:-warn}

maco() { # maco TRANSPORT PORT: the benchmark over MACO_TRANSPORT
  local tr=$1 port=$2 rc out=/tmp/bench-$1.out
  if [ "$IBVM_NVMS" = 1 ]; then
    MACO_TRANSPORT=$tr timeout 900 "$B/tools/maco-run" -n 2 --timeout 890 "$X" "${args[@]}" > "$out" 2>&1
    rc=$?
  else
    ibvm_barrier "bench-$port" 120 || echo "barrier bench-$port failed"
    MACO_TRANSPORT=$tr MACO_RANK=$IBVM_INDEX MACO_WORLD_SIZE=2 MACO_LOCAL_RANK=0 \
      MACO_BOOTSTRAP_ADDR=$IBVM_SERVER_IP:$port MACO_BOOTSTRAP_NONCE=4d41434f4943 \
      MACO_BOOTSTRAP_TIMEOUT=120s timeout 900 "$X" "${args[@]}" > "$out" 2>&1
    rc=$?
  fi
  sed "s/^/IBVM-BENCH maco_$tr vms=$IBVM_NVMS | /" "$out"
  [ $rc = 0 ] || { echo "IBVM-BENCH maco_$tr failed rc=$rc"; fail=$((fail + 1)); }
}

for r in ${BENCH_RUNS:-maco_ib perftest maco_tcp}; do
  case $r in
    maco_ib) maco ib 29611;;
    maco_tcp) maco tcp 29612;;
    maco_host) maco host 29613;;
    perftest) bash "${IBVM_PERFTEST:?--env IBVM_PERFTEST=path of guest/perftest.sh}" || fail=$((fail + 1));;
    *) echo "unknown BENCH_RUNS entry $r"; fail=$((fail + 1));;
  esac
done
exit $fail
