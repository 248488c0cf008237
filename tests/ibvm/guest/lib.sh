# Helpers for guest scripts inside the test VM (busybox sh or bash): `. /ibvm/lib.sh`
ibvm_uptime() { cut -d' ' -f1 /proc/uptime; }

# Index of the RoCE v2 GID that holds an IPv4-mapped address (::ffff:a.b.c.d) on port 1 of DEV.
ibvm_find_gid() {
  _d=/sys/class/infiniband/${1:-rxe0}/ports/1
  for _g in $(ls "$_d/gids" 2>/dev/null | sort -n); do
    case "$(cat "$_d/gids/$_g" 2>/dev/null)" in
      0000:0000:0000:0000:0000:ffff:*)
        [ "$(cat "$_d/gid_attrs/types/$_g" 2>/dev/null)" = "RoCE v2" ] && { echo "$_g"; return 0; } ;;
    esac
  done
  return 1
}

# ibvm_retry TRIES DELAY CMD...: run CMD until it succeeds, at most TRIES times, DELAY s apart.
ibvm_retry() {
  _n=$1 _s=$2; shift 2
  while :; do
    "$@" && return 0
    _n=$((_n - 1)); [ $_n -le 0 ] && return 1
    sleep "$_s"
  done
}

# ibvm_wait_tcp HOST PORT [SECONDS]: wait until something listens on HOST:PORT (default 60 s).
# It connects (and hangs up) to find out: do not point it at a server that takes one peer only
# (perftest, ibv_rc_pingpong); there use ibvm_wait_listen on that VM and ibvm_barrier.
ibvm_wait_tcp() {
  _t=$(( ${3:-60} * 5 ))
  while [ $_t -gt 0 ]; do
    nc -w 1 "$1" "$2" </dev/null >/dev/null 2>&1 && return 0
    sleep 0.2; _t=$((_t - 1))
  done
  return 1
}

# ibvm_barrier NAME [SECONDS]: both VMs of a two-VM run meet here (TCP on VM 0's address, a port
# from NAME). No-op with one VM. Note: the client's probe connection counts as the meeting.
ibvm_barrier() {
  [ "${IBVM_NVMS:-1}" -gt 1 ] || return 0
  _p=$(( 20000 + 0x$(echo "$1" | md5sum | cut -c1-4) % 20000 ))
  if [ "$IBVM_INDEX" = 0 ]; then
    timeout "${2:-120}" nc -l -p "$_p" </dev/null >/dev/null 2>&1
  else
    ibvm_wait_tcp "$IBVM_SERVER_IP" "$_p" "${2:-120}"
  fi
}

# ibvm_wait_listen PORT [SECONDS]: wait until a local program listens on TCP PORT (default 60 s).
# Unlike ibvm_wait_tcp it does not connect, so it is safe for servers that accept one peer only.
ibvm_wait_listen() {
  _t=$(( ${2:-60} * 10 ))
  while [ $_t -gt 0 ]; do
    netstat -ltn 2>/dev/null | grep -q "[:.]$1 " && return 0
    sleep 0.1; _t=$((_t - 1))
  done
  return 1
}
