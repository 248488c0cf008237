#!/usr/bin/env bash
# Builds the test VM's initramfs: static busybox, the rxe kernel modules (with their dependencies)
# of the cached Debian kernel, the host's verbs userspace (ibv_devinfo, rdma, ip, perftest, the rxe
# provider) and any extra host files or folders, each with every shared library ldd finds for it.
#   usage: build-initramfs.sh OUT.cpio.gz [FILE|DIR ...]
# Extra files and folders keep their absolute path in the VM (a build folder with RPATHs works
# unchanged). Folders are copied whole except *.o and *.a (IBVM_PACK_EXCLUDE, shell patterns,
# space-separated; empty to copy everything). IBVM_EXTRA_TOOLS: more host programs for /usr/bin.
# Needs setup.sh to have run (the kernel in the cache).
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
OUT=$(realpath -m "$1"); shift
ibvm_kernel || ibvm_die "no kernel in $IBVM_CACHE (run tests/ibvm/setup.sh)"

ST=$(mktemp -d "${TMPDIR:-/tmp}/ibvm-initramfs.XXXXXX")
trap 'rm -rf "$ST"' EXIT
chmod 755 "$ST"
# A merged-/usr tree like the host's, so every library path ldd prints is valid as is.
mkdir -p "$ST"/usr/{bin,sbin,lib,lib64} "$ST"/{proc,sys,dev,tmp,mnt,root,run,ibvm,etc/libibverbs.d}
ln -s usr/bin "$ST/bin"; ln -s usr/sbin "$ST/sbin"; ln -s usr/lib "$ST/lib"; ln -s usr/lib64 "$ST/lib64"

elfs=()   # everything whose shared libraries we must carry
# Host tools first (they win over busybox applets of the same name, e.g. ip).
TOOLS="ip rdma ibv_devinfo ibv_devices ibv_rc_pingpong ib_write_bw ib_write_lat ib_read_bw ib_read_lat
       ib_send_bw ib_send_lat ib_atomic_bw bash ${IBVM_EXTRA_TOOLS:-}"
for t in $TOOLS; do
  p=$(command -v "$t" || true)
  [ -n "$p" ] || { ibvm_log "warning: $t not found on the host, not packed"; continue; }
  cp -L "$p" "$ST/usr/bin/$(basename "$p")"; elfs+=("$p")
done
cp /bin/busybox "$ST/usr/bin/busybox"
for a in $("$ST/usr/bin/busybox" --list); do
  [ -e "$ST/usr/bin/$a" ] || [ -e "$ST/usr/sbin/$a" ] || ln -s busybox "$ST/usr/bin/$a"
done
ln -sf ../bin/busybox "$ST/usr/sbin/modprobe"   # the kernel's request_module calls /sbin/modprobe

# The rxe verbs provider and its driver file (libibverbs loads both at run time, ldd can't see them).
MULTI=/usr/lib/x86_64-linux-gnu
for prov in "$MULTI"/libibverbs/librxe-rdmav*.so; do
  [ -e "$prov" ] || ibvm_die "no rxe provider in $MULTI/libibverbs (ibverbs-providers)"
  cp --parents -L "$prov" "$ST/"; elfs+=("$prov")
done
cp /etc/libibverbs.d/rxe.driver "$ST/etc/libibverbs.d/"
# Small bits of /etc some programs look at.
echo "root:x:0:0:root:/root:/bin/sh" > "$ST/etc/passwd"; echo "root:x:0:" > "$ST/etc/group"
printf '127.0.0.1 localhost\n10.13.0.1 ibvm0\n10.13.0.2 ibvm1\n' > "$ST/etc/hosts"
echo "hosts: files" > "$ST/etc/nsswitch.conf"

# Kernel modules: rxe and what it needs (crc32 is loaded by name, so listed), the netdevs, 9p.
MODS="rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32-pclmul dummy virtio_pci virtio_net 9p 9pnet_virtio"
for m in $MODS; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r f; do
  rel=${f#"$KROOT"/}; mkdir -p "$ST/$(dirname "$rel")"; cp "$f" "$ST/$rel"
done
cp "$KROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$ST/lib/modules/$KVER/" 2>/dev/null || true
depmod -b "$ST" "$KVER"

# Extra host files and folders, at their absolute paths.
is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }
excl=(); for pat in ${IBVM_PACK_EXCLUDE-*.o *.a}; do excl+=(--exclude="$pat"); done
for x in "$@"; do
  [ -e "$x" ] || ibvm_die "not found: $x"
  a=$(realpath -s "$x")
  mkdir -p "$ST$(dirname "$a")"
  if [ -d "$a" ]; then
    mkdir -p "$ST$a"
    tar -C "$a" "${excl[@]}" -cf - . | tar -C "$ST$a" -xf -
    while IFS= read -r -d '' f; do is_elf "$f" && elfs+=("$f"); done < <(find "$a" -type f -print0)
  else
    cp -L "$a" "$ST$a"; is_elf "$a" && elfs+=("$a")
  fi
done

# Shared libraries of everything above (and the dynamic loader), at their host paths.
for f in "${elfs[@]}"; do
  out=$(ldd "$f" 2>/dev/null) || continue   # static or not a dynamic object
  if grep -q 'not found' <<<"$out"; then
    ibvm_log "warning: $f: $(grep 'not found' <<<"$out" | awk '{print $1}' | tr '\n' ' ')not found on the host"
  fi
  grep -o '/[^ )]*' <<<"$out" || true
done | sort -u | while read -r lib; do
  [ -e "$ST$lib" ] || cp --parents -L "$lib" "$ST/"
done

cp "$IBVM_DIR/guest/init" "$ST/init"; chmod 755 "$ST/init"
cp "$IBVM_DIR/guest/lib.sh" "$ST/ibvm/lib.sh"
mkdir -p "$(dirname "$OUT")"
(cd "$ST" && find . -print0 | cpio -o -0 -H newc --quiet -R 0:0 | gzip -1) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
size=$(du -sm "$ST" | cut -f1)
ibvm_log "initramfs $OUT: ${size} MiB unpacked, $(( $(stat -c %s "$OUT") / 1024 / 1024 )) MiB gzip, kernel $KVER"
[ "$size" -lt 400 ] || ibvm_log "warning: ${size} MiB is unpacked into the VM's RAM; raise run.sh --mem"
