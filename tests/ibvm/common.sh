# shellcheck shell=bash
# Host-side helpers shared by the tests/ibvm scripts (sourced, not run).
# The cache holds the unpacked Debian kernel; it survives between runs and between checkouts.
# shellcheck disable=SC2034  # used by the scripts that source this
IBVM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IBVM_CACHE=${IBVM_CACHE:-${HOME:-/root}/.cache/maco-ibvm}

ibvm_log() { echo "ibvm: $*" >&2; }
ibvm_die() { echo "ibvm: error: $*" >&2; exit 2; }
ibvm_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The unpacked kernel setup.sh left in the cache: sets KROOT (a tree with boot/ and lib/modules/),
# KVER and KIMAGE. Returns 1 when there is none.
ibvm_kernel() {
  local cur=$IBVM_CACHE/kernel/current
  [ -f "$cur" ] || return 1
  KVER=$(cat "$cur")
  KROOT=$IBVM_CACHE/kernel/$KVER
  KIMAGE=$KROOT/boot/vmlinuz-$KVER
  [ -f "$KROOT/.complete" ] && [ -f "$KIMAGE" ] && [ -f "$KROOT/lib/modules/$KVER/modules.dep" ]
}
