#!/usr/bin/env bash
# Installs what the soft-RoCE VM tests need and puts an unpacked Debian kernel in the cache.
# Idempotent and quiet: when everything is there already it checks and exits in well under a second.
#   usage: setup.sh [--check]     (--check: install nothing, exit 1 if something is missing)
# Environment: IBVM_CACHE (default ~/.cache/maco-ibvm), IBVM_KERNEL_REFRESH=1 to fetch
# the kernel that linux-image-amd64 currently depends on even when one is cached.
set -euo pipefail
. "$(dirname "$0")/common.sh"
check_only=0; [ "${1:-}" = --check ] && check_only=1

PKGS="qemu-system-x86 busybox-static kmod cpio iproute2 libibverbs1 ibverbs-providers ibverbs-utils
      perftest libibverbs-dev rdma-core rdmacm-utils librdmacm1"

missing=()
for p in $PKGS; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done

if [ $check_only = 1 ]; then
  [ ${#missing[@]} = 0 ] || { ibvm_log "missing packages: ${missing[*]}"; exit 1; }
  ibvm_kernel || { ibvm_log "no kernel in $IBVM_CACHE/kernel (run setup.sh)"; exit 1; }
  exit 0
fi
mkdir -p "$IBVM_CACHE/kernel"
# One setup at a time (ctest -j may start several): apt/dpkg and the kernel unpack are not reentrant.
exec 9>"$IBVM_CACHE/setup.lock"
flock 9

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
export DEBIAN_FRONTEND=noninteractive

if [ ${#missing[@]} -gt 0 ]; then
  ibvm_log "installing ${missing[*]}"
  # rdma-core's own service (rdma-ndd, udev rules) is harmless here, but do not start services.
  inst() { as_root apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>"$IBVM_CACHE/apt.err"; }
  if ! inst; then
    as_root apt-get update -q >/dev/null 2>>"$IBVM_CACHE/apt.err" || true
    inst || { cat "$IBVM_CACHE/apt.err" >&2; ibvm_die "apt-get install failed (root needed: $(id -un))"; }
  fi
fi

# The kernel: the package linux-image-amd64 depends on, unpacked (not installed) under the cache.
if ibvm_kernel && [ "${IBVM_KERNEL_REFRESH:-0}" != 1 ]; then
  exit 0
fi
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=$(kpkg)
if [ -z "$KPKG" ]; then
  as_root apt-get update -q >/dev/null 2>&1 || true
  KPKG=$(kpkg)
fi
if [ -z "$KPKG" ]; then
  ibvm_kernel && { ibvm_log "cannot resolve linux-image-amd64; keeping cached kernel $KVER"; exit 0; }
  ibvm_die "cannot resolve linux-image-amd64 (no apt lists?)"
fi
NEWVER=${KPKG#linux-image-}
if [ -f "$IBVM_CACHE/kernel/$NEWVER/.complete" ]; then
  echo "$NEWVER" > "$IBVM_CACHE/kernel/current"; exit 0
fi
ibvm_log "fetching and unpacking $KPKG into $IBVM_CACHE/kernel/$NEWVER"
tmp=$(mktemp -d "$IBVM_CACHE/kernel/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"   # so apt's _apt user may write the download (else a warning)
if ! (cd "$tmp" && apt-get download -q "$KPKG" >/dev/null 2>"$tmp/err"); then
  cat "$tmp/err" >&2
  ibvm_kernel && { ibvm_log "download failed; keeping cached kernel $KVER"; exit 0; }
  ibvm_die "apt-get download $KPKG failed"
fi
mkdir "$tmp/root"
dpkg-deb -x "$tmp"/"$KPKG"_*.deb "$tmp/root"
depmod -b "$tmp/root" "$NEWVER"
[ -f "$tmp/root/boot/vmlinuz-$NEWVER" ] || ibvm_die "no boot/vmlinuz-$NEWVER in $KPKG"
touch "$tmp/root/.complete"
rm -rf "$IBVM_CACHE/kernel/$NEWVER"
mv "$tmp/root" "$IBVM_CACHE/kernel/$NEWVER"
echo "$NEWVER" > "$IBVM_CACHE/kernel/current"
ibvm_log "kernel $NEWVER ready"
