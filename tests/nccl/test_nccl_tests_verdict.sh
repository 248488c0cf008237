#!/usr/bin/env bash
# How run_nccl_tests.sh judges a run (nccl_tests_verdict.sh), on logs of real runs in
# testdata/ (4 H200s, 2026-11-28: a passing all_reduce_perf, hypercube_perf at -g 4 with
# wrong values) and two made from them (a forwarded call; a run that ended before any row).
# No GPU. Exit status 0 when every check holds, 1 otherwise, naming each failed check.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/nccl/nccl_tests_verdict.sh
. "$here/nccl_tests_verdict.sh"
data=$here/testdata
bad=0

expect() { # NAME GOT WANT
  if [ "$2" != "$3" ]; then
    echo "FAIL $1: got '$2', want '$3'"
    bad=$((bad + 1))
  else
    echo "ok   $1"
  fi
}
yes_no() { if "$@"; then echo yes; else echo no; fi; }

expect "parse: a passing all_reduce" "$(parse "$data/all_reduce_g4_pass.log")" "0 0 52.1535"
# 12 rows; #wrong printed as 32 ... 524288 and 2.09715e+06, 8.38861e+06 (twice each).
expect "parse: hypercube's wrong values, large counts in e-notation" \
  "$(parse "$data/hypercube_g4_wrong.log")" "22369600 20 28.9988"
expect "parse: a log without result rows" "$(parse "$data/aborted.log")" "none none none"
expect "fallback: nothing forwarded" "$(fallback "$data/all_reduce_g4_pass.log")" "none"
expect "fallback: forwarded calls named with their count" \
  "$(fallback "$data/all_reduce_g4_forwarded.log")" "ncclAllReduce=4"
expect "fallback: no at-exit line" "$(fallback "$data/aborted.log")" "none"

expect "values_wrong: positive #wrong" "$(yes_no values_wrong 22369600 20)" yes
expect "values_wrong: e-notation #wrong" "$(yes_no values_wrong 2.09715e+06 0)" yes
expect "values_wrong: only out-of-bounds values" "$(yes_no values_wrong 0 3)" yes
expect "values_wrong: none wrong" "$(yes_no values_wrong 0 0)" no
expect "values_wrong: no rows (none)" "$(yes_no values_wrong none none)" no

expect "racy: hypercube -g 4" "$(yes_no racy hypercube_perf env X=1 ./h -b 8 -g 4 -R 0)" yes
expect "racy: hypercube -t 2 -g 2" "$(yes_no racy hypercube_perf ./h -t 2 -g 2)" yes
expect "racy: hypercube -g 2 (one step)" "$(yes_no racy hypercube_perf ./h -g 2)" no
expect "racy: hypercube one process per GPU" "$(yes_no racy hypercube_perf mpirun -np 4 ./h -g 1)" no
expect "racy: all_reduce -g 4" "$(yes_no racy all_reduce_perf ./a -g 4)" no

if [ "$bad" -gt 0 ]; then
  echo "test_nccl_tests_verdict: $bad check(s) failed"
  exit 1
fi
echo "test_nccl_tests_verdict: every check passed"
