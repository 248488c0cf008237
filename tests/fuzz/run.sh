#!/usr/bin/env bash
# Runs every MACO fuzzer for SECONDS seconds each, one after the other:
#   tests/fuzz/run.sh SECONDS [--no-build]
# Builds first with tests/fuzz/build.sh into $FUZZ_BUILD_DIR (default build-fuzz) unless
# --no-build says the binaries are there. Each fuzzer starts from a temporary copy of its seed
# corpus, tests/fuzz/corpus/<name>/ (the repository is never written); an input that fails is
# saved as $FUZZ_BUILD_DIR/artifacts/<name>/crash-* (or leak-*, timeout-*, oom-*), and its
# libFuzzer log is kept in $FUZZ_BUILD_DIR/logs/<name>.log. Prints one line per fuzzer (runs,
# coverage, result) and exits non-zero when any fuzzer found a crash, a leak, a UBSan report,
# a timeout or an out-of-memory input. Prints "SKIP: <reason>" and exits 77 (skipped:
# docs/tools.md, "Exit statuses") when clang or its libFuzzer runtime is missing.
set -euo pipefail
usage="usage: tests/fuzz/run.sh SECONDS [--no-build]"
secs="${1:?$usage}"
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "$usage" >&2; exit 2; }
build=1
if (( $# > 1 )); then
  [[ "$2" == --no-build ]] || { echo "$usage" >&2; exit 2; }
  build=0
fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$out" in /*) ;; *) out="$root/$out" ;; esac
cc="${CC:-clang}"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/maco-fuzz.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# Is there a clang that links libFuzzer with ASan and UBSan? Try a tiny fuzzer.
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "SKIP: $cc not found (the fuzzers need clang with libFuzzer)"
  exit 77
fi
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
  >"$tmp/probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$tmp/probe.c" -o "$tmp/probe" \
  >"$tmp/probe.log" 2>&1 || ! "$tmp/probe" -runs=1 >>"$tmp/probe.log" 2>&1; then
  echo "SKIP: $cc cannot build or run a libFuzzer binary with ASan and UBSan:" \
    "$(grep -m1 -i 'error' "$tmp/probe.log" || head -n1 "$tmp/probe.log")"
  exit 77
fi

if (( build )); then
  "$root/tests/fuzz/build.sh" "$out"
fi

# name and -max_len: 128-byte ids, 2 + 128-byte handles, link streams up to 64 KiB (they must
# fit a socket buffer), short configuration texts, plans up to 64 KiB (the shipped ones are
# below it), a TCP header with the receiver's state and a hello (125 bytes), a port channel
# hello with three limits (198 bytes), an IB endpoint, a link layer and a ready message (145),
# the setup handshake's nonce, options, hello, proof and answer (289).
fuzzers=("fuzz_unique_id 128" "fuzz_bootstrap_hello 289" "fuzz_mem_handle 130"
  "fuzz_link_frames 65536" "fuzz_config 64"
  "fuzz_plan 65536" "fuzz_tcp_wire 125" "fuzz_port_hello 198"
  "fuzz_ib_endpoint 145")
mkdir -p "$out/logs"
failed=0
total_start=$(date +%s)
for entry in "${fuzzers[@]}"; do
  read -r name max_len <<<"$entry"
  bin="$out/$name"
  if [[ ! -x "$bin" ]]; then
    echo "fuzz: $name: $bin is missing (run without --no-build)"
    failed=1
    continue
  fi
  work="$tmp/corpus/$name"
  mkdir -p "$work" "$out/artifacts/$name"
  cp -R "$root/tests/fuzz/corpus/$name/." "$work/"
  log="$out/logs/$name.log"
  start=$(date +%s)
  rc=0
  "$bin" -max_total_time="$secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$name/" "$work" >"$log" 2>&1 || rc=$?
  wall=$(( $(date +%s) - start ))
  # libFuzzer's last status line: "#RUNS DONE cov: C ft: F corp: N/Sb ..."
  status="$(grep -E '^#[0-9]+' "$log" | tail -n1 || true)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)"
  [[ -n "$runs" ]] || runs="$(sed -E -n 's/^#([0-9]+).*/\1/p' <<<"$status")"
  cov="$(sed -E -n 's/.* cov: ([0-9]+).*/\1/p' <<<"$status")"
  ft="$(sed -E -n 's/.* ft: ([0-9]+).*/\1/p' <<<"$status")"
  corp="$(sed -E -n 's/.* corp: ([0-9]+\/[0-9a-zA-Z]+).*/\1/p' <<<"$status")"
  result=ok
  if (( rc != 0 )) || grep -qE 'runtime error:|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' \
    "$log"; then
    result="FAILED (exit $rc; log $log; inputs in $out/artifacts/$name/)"
    failed=1
  fi
  printf 'fuzz: %-16s runs %-9s cov %-5s ft %-6s corpus %-10s %3d s  %s\n' "$name" \
    "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$wall" "$result"
  if [[ "$result" != ok ]]; then
    # The report: the sanitizer's or libFuzzer's, up to the reproducer line.
    grep -n -m1 -E '^==[0-9]+==|runtime error:|^ERROR:|invariant broken' "$log" >/dev/null &&
      sed -n "$(grep -n -m1 -E '^==[0-9]+==|runtime error:|^ERROR:|invariant broken' "$log" |
        cut -d: -f1),\$p" "$log" | head -n 60
  fi
done
echo "fuzz: all fuzzers done in $(( $(date +%s) - total_start )) s"
exit "$failed"
