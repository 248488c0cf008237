#!/bin/sh
# Harness smoke test (ctest-run.sh's default guest script): the rxe device answers and an RC
# queue pair exchanges 100 messages (ibv_rc_pingpong), within one VM or from VM 1 to VM 0.
. /ibvm/lib.sh
fail=0
ibv_devinfo -d "$IBVM_DEV" | grep -q 'PORT_ACTIVE' || { echo "smoke: $IBVM_DEV port not active"; ibv_devinfo -d "$IBVM_DEV"; fail=$((fail + 1)); }
port=18515
pp() { timeout 60 ibv_rc_pingpong -d "$IBVM_DEV" -g "$IBVM_GID_INDEX" -p $port -n 100 -s 4096 "$@"; }
if [ "$IBVM_ROLE" != client ]; then
  pp > /tmp/pp-server.out 2>&1 & sp=$!
  ibvm_wait_listen $port 30 || echo "smoke: ibv_rc_pingpong server does not listen"
fi
[ "$IBVM_ROLE" = single ] || ibvm_barrier smoke 120 || { echo "smoke: barrier failed"; fail=$((fail + 1)); }
if [ "$IBVM_ROLE" != server ]; then
  if pp "$IBVM_SERVER_IP" > /tmp/pp-client.out 2>&1; then grep iters /tmp/pp-client.out
  else echo "smoke: ibv_rc_pingpong client failed:"; cat /tmp/pp-client.out; fail=$((fail + 1)); fi
fi
if [ "$IBVM_ROLE" != client ]; then
  wait $sp || { echo "smoke: ibv_rc_pingpong server failed:"; cat /tmp/pp-server.out; fail=$((fail + 1)); }
fi
[ $fail = 0 ] && echo "smoke: PASS ($IBVM_ROLE, $IBVM_DEV gid[$IBVM_GID_INDEX] $IBVM_IP)"
exit $fail
