#!/usr/bin/env bash
# The verdict of one nccl-tests run from its log, for tests/nccl/run_nccl_tests.sh (which
# sources this file); tests/nccl/test_nccl_tests_verdict.sh checks it on real logs
# (tests/nccl/testdata) without a GPU.

# Sums the #wrong columns of a log's result rows (size count type [redop] root, then time
# algbw busbw #wrong twice: counted from the end, as hypercube_perf has no redop column;
# large counts print as 2.09715e+06); prints "wrong oob busbw".
parse() {
  awk '
    function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?(e\+[0-9]+)?$/ }
    /^ *[0-9]+ +[0-9]+ / && NF >= 12 {
      if (num($(NF - 4))) w += $(NF - 4); if (num($NF)) w += $NF; rows++ }
    /Out of bounds values/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) oob = $i }
    /Avg bus bandwidth/ { bw = $NF }
    END { printf "%s %s %s\n", (rows ? w + 0 : "none"), (oob == "" ? "none" : oob), (bw == "" ? "none" : bw) }
  ' "$1"
}

# What MACO forwarded to NCCL: the at-exit counts with a forwarded count above 0.
fallback() {
  local line
  line=$(grep -h "calls (on MACO/forwarded to NCCL):" "$1" | tail -1 | sed 's/.*forwarded to NCCL)://')
  echo "$line" | awk '{ s = ""; for (i = 1; i < NF; i += 2) { split($(i + 1), c, "/"); if (c[2] > 0) s = s " " $i "=" c[2] } print (s == "" ? "none" : substr(s, 2)) }'
}

# values_wrong WRONG OOB: parse's counts say the run checked values and some were wrong
# (a positive #wrong sum or out-of-bounds count; "none", a log without rows, is not).
values_wrong() {
  awk -v w="$1" -v o="$2" 'BEGIN {
    if (w ~ /^[0-9.e+]+$/ && w + 0 > 0) exit 0
    if (o ~ /^[0-9]+$/ && o + 0 > 0) exit 0
    exit 1 }'
}

# racy NAME ARGS...: the test's values depend on timing with these arguments (hypercube_perf
# with -g x -t >= 4: its steps nest in the harness's group; see the header).
racy() {
  local name=$1 g=1 t=1 prev=""
  shift
  [ "$name" = hypercube_perf ] || return 1
  for a in "$@"; do
    case "$prev" in -g) g=$a ;; -t) t=$a ;; esac
    prev=$a
  done
  [ $((g * t)) -ge 4 ]
}

