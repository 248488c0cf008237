#!/bin/bash
# Guest script: the port-channel suite (tests/test_port_channel_mp) over the IB verbs transport
# on soft-RoCE. Needs --pack BUILD (the build folder or its binaries) and --env IBVM_BUILD=BUILD.
#   one VM:   maco-run -n 2 and -n 4 with TEST_MACO_PORT_TRANSPORT=ib, then -n 2 with auto and
#             MACO_TRANSPORT=ib (the killed-peer and bad-GID-index cases are tests of the suite),
#             then the killed peer found by QP retries (killed_retry) and MACO_IB_HCA (hca)
#   two VMs:  rank 0 in VM 0, rank 1 in VM 1 (each its own node, distinct GIDs), bootstrapped
#             by hand over 10.13.0.1: TEST_MACO_PORT_TRANSPORT=ib, then auto (IB is chosen)
# PORT_FILTER (a --gtest_filter) narrows the suite; PORT_RUNS ("ib4 auto", ...) the runs.
# Prints "IBVM-PORT run=NAME rc=N" per run; exit status: how many runs failed.
. /ibvm/lib.sh
B=${IBVM_BUILD:?--env IBVM_BUILD=the build folder}
T=$B/tests/test_port_channel_mp
fail=0
filter=()
[ -n "${PORT_FILTER:-}" ] && filter=(--gtest_filter="$PORT_FILTER")
export MACO_LOG_LEVEL=${MACO_LOG_LEVEL:-warn}

run() { # run NAME CMD...: one run of the suite, its rc reported
  local name=$1 rc t0
  shift
  case " ${PORT_RUNS:-$name} " in *" $name "*) ;; *) return;; esac
  t0=$(ibvm_uptime)
  echo "IBVM-PORT start run=$name uptime=$t0"
  "$@"
  rc=$?
  echo "IBVM-PORT run=$name rc=$rc secs=$(echo "$(ibvm_uptime) - $t0" | bc)"
  [ $rc = 0 ] || fail=$((fail + 1))
}

if [ "$IBVM_NVMS" = 1 ]; then
  [ -n "${PORT_RUNS:-}" ] || PORT_RUNS="ib2 ib4 auto_ib2 killed_retry hca"
  run ib2 env TEST_MACO_PORT_TRANSPORT=ib timeout 600 "$B/tools/maco-run" -n 2 --timeout 590 "$T" "${filter[@]}"
  run ib4 env TEST_MACO_PORT_TRANSPORT=ib timeout 600 "$B/tools/maco-run" -n 4 --timeout 590 "$T" "${filter[@]}"
  run auto_ib2 env TEST_MACO_PORT_TRANSPORT=auto MACO_TRANSPORT=ib timeout 600 "$B/tools/maco-run" -n 2 --timeout 590 "$T" "${filter[@]}"
  # The killed peer found by the QP's retries (a 16.8 ms timeout: they run out in about 120 ms,
  # before the 2 s look at the bootstrap link): its error names the retry status.
  killed_retry() {
    env TEST_MACO_PORT_TRANSPORT=ib MACO_IB_TIMEOUT=12 timeout 300 "$B/tools/maco-run" -n 2 --timeout 290 \
      "$T" --gtest_filter='*PeerKilledMidTransferFailsNamingIt*' 2>&1 | tee /tmp/killed.out
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    grep -q 'transport retry counter exceeded' /tmp/killed.out || { echo "no retry-exceeded error above"; return 1; }
  }
  run killed_retry killed_retry
  # MACO_IB_HCA: an exact name with its port is used; excluding the only device makes IB
  # unavailable, and MACO_TRANSPORT=ib then fails naming the filter.
  hca() {
    local one=(timeout 120 "$B/tools/maco-run" -n 2 --timeout 110 "$T" --gtest_filter='*TransportFollowsTopology*')
    env TEST_MACO_PORT_TRANSPORT=ib MACO_IB_HCA="=$IBVM_DEV:1" "${one[@]}" || return 1
    env TEST_MACO_PORT_TRANSPORT=ib MACO_IB_HCA="^$IBVM_DEV" "${one[@]}" > /tmp/hca.out 2>&1 && { cat /tmp/hca.out; echo "IB was used with MACO_IB_HCA=^$IBVM_DEV"; return 1; }
    grep -q "no ACTIVE RDMA port that MACO_IB_HCA allows" /tmp/hca.out || { cat /tmp/hca.out; echo "no error naming MACO_IB_HCA above"; return 1; }
    grep -m1 "MACO_IB_HCA allows" /tmp/hca.out
  }
  run hca hca
else
  [ -n "${PORT_RUNS:-}" ] || PORT_RUNS="ib_2vm auto_2vm"
  two() { # the suite as rank IBVM_INDEX of 2, bootstrapped over VM 0's address
    local port=$1
    shift
    ibvm_barrier "port-$port" 120 || echo "barrier port-$port failed"
    env MACO_RANK="$IBVM_INDEX" MACO_WORLD_SIZE=2 MACO_LOCAL_RANK=0 \
      MACO_BOOTSTRAP_ADDR="$IBVM_SERVER_IP:$port" MACO_BOOTSTRAP_NONCE=4d41434f4942 \
      MACO_BOOTSTRAP_TIMEOUT=120s "$@" timeout 600 "$T" "${filter[@]}"
  }
  run ib_2vm two 29501 TEST_MACO_PORT_TRANSPORT=ib
  run auto_2vm two 29502 TEST_MACO_PORT_TRANSPORT=auto TEST_MACO_EXPECT_REMOTE=ib
fi
exit $fail
