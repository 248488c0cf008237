#!/usr/bin/env bash
# Static analysis of MACO's C code with cppcheck: scripts/check_static.sh [BUILD_DIR]
# (default build). Reads BUILD_DIR/compile_commands.json (CMake writes it) and analyses every C
# file of the library, the NCCL library and the tools (src, proxy, algorithms, runtime, nccl,
# tools), with the defines and include paths they are built with.
#
# The checks: cppcheck's `warning` class (undefined behaviour: uninitialised reads, NULL
# dereferences, out-of-bounds accesses, invalid arguments to libc, leaks of resources) and
# `portability` (code whose meaning depends on the platform). Not `style` or `performance`:
# matters of taste, not bugs. Zero findings are allowed: a finding is fixed, or suppressed in
# place with `cppcheck-suppress <id> ; <why it is not a bug>` on the line before.
# Exit status 1 on a finding, 0 without; prints SKIP and exits 0 when cppcheck is missing
# (scripts/setup.sh installs it; CI sets STATIC_REQUIRE=1, which fails instead).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
if ! command -v cppcheck >/dev/null 2>&1; then
  if [[ "${STATIC_REQUIRE:-0}" == 1 ]]; then
    echo "check_static: cppcheck is not installed (STATIC_REQUIRE=1)" >&2
    exit 1
  fi
  echo "SKIP: check_static: cppcheck is not installed (Debian: cppcheck; scripts/setup.sh)"
  exit 0
fi
[[ -f "$build/compile_commands.json" ]] || {
  echo "check_static: $build/compile_commands.json is missing: configure the build first" >&2
  exit 2
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$root" "$build/compile_commands.json" "$tmp/cc.json" <<'PY'
import json, sys
root, src, dst = sys.argv[1:]
keep = [e for e in json.load(open(src))
        if e["file"].endswith(".c") and any(e["file"].startswith(f"{root}/{d}/")
        for d in ("src", "proxy", "algorithms", "runtime", "nccl", "tools"))]
json.dump(keep, open(dst, "w"))
print(f"check_static: {len(keep)} C files")
PY
# The CUDA headers need a known host compiler: cppcheck defines none of its own.
status=0
cppcheck --project="$tmp/cc.json" -j "$(nproc)" --quiet --enable=warning,portability \
  --inline-suppr --library=posix -D__GNUC__=12 -D__GNUC_MINOR__=2 -D__x86_64__=1 -D__linux__=1 \
  --error-exitcode=1 2>"$tmp/findings.txt" || status=$?
if [[ -s "$tmp/findings.txt" || $status -ne 0 ]]; then
  cat "$tmp/findings.txt"
  echo "check_static: FAILED: fix each finding or suppress it in place with its reason"
  exit 1
fi
echo "check_static: no findings"
