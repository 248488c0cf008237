#!/usr/bin/env bash
# The TCP transport between ranks in separate network namespaces, joined by a veth pair: two
# "hosts" on one machine, each with its own address, talking over a real (virtual) link.
#
#   tests/netns/run.sh BUILD_DIR [test|bench]
#
# test (default; ctest runs it as port_channel_tcp_netns):
#   1. the port-channel suite (tests/test_port_channel_mp) with one rank in each namespace;
#   2. the same with two ranks in each namespace (host memory inside, TCP between);
#   3. a link cut mid-transfer: the veth goes down while rank 0 streams puts and flushes to
#      rank 1; rank 0 must fail with an error naming rank 1 within its bound.
# bench: MACO put bandwidth (bench_port_host) against iperf3 over the same veth, and the
#   8-byte flush and ping-pong latency; prints a table (docs/performance.md quotes it).
#
# Needs root (ip netns); prints SKIP and exits 77 where namespaces cannot be made. Every
# namespace, link and process it makes is removed on every way out. Traffic stays on the
# veth pair (10.199.0.0/24 exists only inside the two namespaces).
set -uo pipefail
B=$(realpath "${1:?usage: run.sh BUILD_DIR [test|bench]}")
MODE=${2:-test}
TEST=$B/tests/test_port_channel_mp
BENCH=$B/tests/bench_port_host
tag=maco$$
NA=$tag-a NB=$tag-b
IPA=10.199.0.1 IPB=10.199.0.2
pids=()

skip() { echo "SKIP: $*"; exit 77; }
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns pids "$NA" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$NB" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$NA" 2>/dev/null
  ip netns del "$NB" 2>/dev/null
}
trap cleanup EXIT INT TERM

[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
ip netns add "$NA" 2>/dev/null || skip "cannot create a network namespace (ip netns add failed)"
ip netns add "$NB" || skip "cannot create a second network namespace"
ip link add "$tag-va" type veth peer name "$tag-vb" || skip "cannot create a veth pair"
ip link set "$tag-va" netns "$NA" && ip link set "$tag-vb" netns "$NB" || exit 1
ip -n "$NA" addr add $IPA/24 dev "$tag-va" && ip -n "$NB" addr add $IPB/24 dev "$tag-vb"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up; done
ip -n "$NA" link set "$tag-va" up && ip -n "$NB" link set "$tag-vb" up || exit 1
# wait until the link carries packets
for _ in $(seq 50); do ip netns exec "$NA" ping -c1 -W1 $IPB >/dev/null 2>&1 && break; sleep 0.1; done

nonce() { od -An -N8 -tx8 /dev/urandom | tr -d ' \n'; }

# job NAME NRANKS RANKS_PER_NS TIMEOUT PROGRAM [ARGS...]: ranks 0.. in namespace A, the rest
# in B, with the node's host id; prints each rank's lines prefixed; returns the first
# failing rank's status (0 when all passed). Extra environment comes from JOB_ENV.
job() {
  local name=$1 n=$2 per=$3 t=$4; shift 4
  local port=$((30000 + RANDOM % 20000)) nc; nc=$(nonce)
  local r rc=0 codes=()
  pids=()
  for ((r = 0; r < n; r++)); do
    local ns=$NA host=netns-a
    if [ $r -ge $per ]; then ns=$NB host=netns-b; fi
    ( ip netns exec "$ns" env MACO_RANK=$r MACO_WORLD_SIZE=$n MACO_LOCAL_RANK=$((r % per)) \
        MACO_BOOTSTRAP_ADDR=$IPA:$port MACO_BOOTSTRAP_NONCE="$nc" MACO_HOST_ID=$host \
        ${JOB_ENV:-} timeout "$t" "$@" 2>&1 | sed -u "s/^/[$name $r] /" ; exit "${PIPESTATUS[0]}" ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p"; local c=$?; codes+=($c)
    [ $rc -eq 0 ] && [ $c -ne 0 ] && rc=$c
  done
  echo "[$name] exit statuses: ${codes[*]}"
  return $rc
}

if [ "$MODE" = bench ]; then
  command -v iperf3 >/dev/null || { apt-get install -y -qq iperf3 >/dev/null 2>&1 || skip "iperf3 missing"; }
  ip netns exec "$NA" iperf3 -s -1 -B $IPA >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  iperf=$(ip netns exec "$NB" iperf3 -c $IPA -t 5 -f m 2>&1 | awk '/receiver/ {print $(NF-2)}')
  echo "iperf3 (1 stream, 5 s): $iperf Mbit/s = $(awk -v m="$iperf" 'BEGIN {printf "%.1f", m / 8}') MB/s"
  ip netns exec "$NA" iperf3 -s -1 -B $IPA >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  iperf2=$(ip netns exec "$NB" iperf3 -c $IPA -t 5 -P 2 -f m 2>&1 | awk '/SUM.*receiver/ {print $(NF-2)}')
  echo "iperf3 (2 streams, 5 s): $iperf2 Mbit/s = $(awk -v m="$iperf2" 'BEGIN {printf "%.1f", m / 8}') MB/s"
  JOB_ENV="MACO_TRANSPORT=tcp ${BENCH_ENV:-}" job bench 2 1 120 "$BENCH" -b 1M -e 64M -f 4 -n 10 -l 200
  exit $?
fi

fail=0
t0=$(date +%s)
JOB_ENV="TEST_MACO_PORT_TRANSPORT=auto MACO_TCP_NSOCKS=4 MACO_TCP_CHUNK_SIZE=128K" \
  job suite-2 2 1 240 "$TEST" || fail=$((fail + 1))
JOB_ENV="TEST_MACO_PORT_TRANSPORT=auto" job suite-4 4 2 240 "$TEST" || fail=$((fail + 1))
# The cut: rank 0 streams to rank 1; after 2 s the veth goes down (no reset reaches anyone).
JOB_ENV="TEST_MACO_PORT_TRANSPORT=auto TEST_MACO_NETNS_CUT=1 MACO_DEVICE_TIMEOUT=10s MACO_BOOTSTRAP_TIMEOUT=20s" \
  job cut 2 1 60 "$TEST" --gtest_filter='*LinkCut*' &
cutjob=$!
sleep 3
ip -n "$NA" link set "$tag-va" down
c0=$(date +%s)
wait $cutjob
rc=$?
echo "[cut] the link went down; the job ended $(( $(date +%s) - c0 )) s later with status $rc"
# Rank 1 sleeps past the cut and exits 0; rank 0 passes only when its transfer failed naming
# rank 1 (the test asserts it).
[ $rc -eq 0 ] || fail=$((fail + 1))
echo "netns: $((3 - fail)) passed, $fail failed ($(( $(date +%s) - t0 )) s)"
[ $fail -eq 0 ]
