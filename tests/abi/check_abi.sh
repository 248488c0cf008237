#!/usr/bin/env bash
# The ABI of libmaco.so.0 and of MACO's libnccl.so.2 against the stored baselines
# (tests/abi/*.abi, libabigail's ABIXML): any change but additions (a function or variable
# removed or changed, a public type's layout changed) fails; additions are reported and pass.
#
#   tests/abi/check_abi.sh LIBMACO LIBNCCL NCCL_H        compare (ctest `abi` runs this)
#   tests/abi/check_abi.sh --update LIBMACO LIBNCCL NCCL_H   rewrite the baselines
#
# Only what the public headers declare counts (include/maco/*.h for libmaco; nccl.h and
# nccl/maco_nccl.h for libnccl), and only exported symbols. The libraries need debug info
# (a Debug or RelWithDebInfo build): without it, or without abidiff (Debian's abigail-tools,
# installed by scripts/setup.sh), the check skips (exit 77) saying why, unless
# ABI_REQUIRE=1 (CI), where that fails. Update the baselines only for an intended ABI
# change, in the commit that makes it (and bump the SONAME for an incompatible one).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
update=0
if [[ "${1:-}" == "--update" ]]; then
  update=1
  shift
fi
if [[ $# -ne 3 ]]; then
  echo "usage: $0 [--update] LIBMACO LIBNCCL NCCL_H" >&2
  exit 2
fi
libmaco=$1 libnccl=$2 nccl_h=$3
skip() {
  if [[ "${ABI_REQUIRE:-0}" == 1 ]]; then
    echo "abi: FAIL: $1 (ABI_REQUIRE=1)" >&2
    exit 1
  fi
  echo "SKIP: abi: $1"
  exit 77
}
if ! command -v abidw >/dev/null 2>&1 || ! command -v abidiff >/dev/null 2>&1; then
  skip "abidw/abidiff are not installed (Debian: abigail-tools; scripts/setup.sh installs it)"
fi
for lib in "$libmaco" "$libnccl"; do
  [[ -f "$lib" ]] || skip "$lib does not exist (not built)"
  readelf -S "$lib" | grep '\.debug_info' >/dev/null ||
    skip "$lib has no debug info (build with CMAKE_BUILD_TYPE=Debug or RelWithDebInfo)"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--drop-private-types --drop-undefined-syms --exported-interfaces-only --no-show-locs
  --no-corpus-path --no-comp-dir-path --type-id-style hash)
abidw "${common[@]}" --headers-dir "$root/include/maco" --out-file "$tmp/libmaco.so.0.abi" "$libmaco"
abidw "${common[@]}" --header-file "$nccl_h" --header-file "$root/nccl/maco_nccl.h" \
  --out-file "$tmp/libnccl.so.2.abi" "$libnccl"
if (( update )); then
  cp "$tmp/libmaco.so.0.abi" "$tmp/libnccl.so.2.abi" "$here/"
  echo "abi: baselines rewritten in $here"
  exit 0
fi
rc=0
for name in libmaco.so.0 libnccl.so.2; do
  out="$tmp/$name.diff"
  # abidiff's status is a bit mask: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
  # Without the added symbols, any change left (a type's layout, a symbol removed or changed)
  # breaks programs built against the baseline: it fails. With them, additions are reported.
  status=0
  abidiff --no-show-locs --no-added-syms "$here/$name.abi" "$tmp/$name.abi" >"$out" 2>&1 || status=$?
  if (( status & 3 )); then
    echo "abi: $name: abidiff failed (status $status):"
    cat "$out"
    rc=1
    continue
  fi
  if (( status & 12 )); then
    echo "abi: $name: the ABI CHANGED against tests/abi/$name.abi (not only additions):"
    cat "$out"
    rc=1
    continue
  fi
  status=0
  abidiff --no-show-locs "$here/$name.abi" "$tmp/$name.abi" >"$out" 2>&1 || status=$?
  if (( status & 4 )); then
    echo "abi: $name: compatible additions against tests/abi/$name.abi:"
    cat "$out"
    echo "abi: $name: if intended, rewrite the baseline: tests/abi/check_abi.sh --update ..."
  else
    echo "abi: $name: unchanged"
  fi
done
exit $rc
