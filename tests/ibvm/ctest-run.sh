#!/usr/bin/env bash
# CTest entry for the soft-RoCE VM tests. Prints "SKIP: <reason>" and exits 77 when qemu or the
# Debian kernel cannot be had (use SKIP_RETURN_CODE 77); otherwise runs run.sh with the same
# arguments and passes its status through (0 pass, 1..122 failures, 125 the VM never reported).
# A run that run.sh ends for a wire stall (exit 123: qemu stopped a VM's virtual NIC, so the run
# tested nothing) is started again, once; a second stall fails the test with 123.
#   usage: ctest-run.sh [run.sh arguments]     (none: guest/smoke.sh in one VM)
# Environment: IBVM_RUN=0 skips; IBVM_NO_SETUP=1 only checks instead of installing (setup.sh
# installs Debian packages as root and downloads the kernel once into IBVM_CACHE);
# IBVM_REQUIRE=1 turns a missing prerequisite into a failure (for CI that must run these).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
skip() {
  if [ "${IBVM_REQUIRE:-0}" = 1 ]; then echo "FAIL (IBVM_REQUIRE=1): $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
[ "${IBVM_RUN:-1}" = 0 ] && skip "IBVM_RUN=0: the soft-RoCE VM tests are switched off"
[ "$(uname -m)" = x86_64 ] || skip "the VM harness is for x86_64 hosts"
command -v apt-get >/dev/null || command -v qemu-system-x86_64 >/dev/null || skip "no qemu and no apt-get (Debian) to install it"
mode=; [ "${IBVM_NO_SETUP:-0}" = 1 ] && mode=--check
if ! err=$("$here/setup.sh" $mode 2>&1); then
  skip "VM prerequisites cannot be had: $(echo "$err" | grep -v '^\s*$' | tail -n 1)"
fi
qemu-system-x86_64 --version >/dev/null 2>&1 || skip "qemu-system-x86_64 does not run"
[ $# -gt 0 ] || set -- --vms 1 --script "$here/guest/smoke.sh"
for attempt in 1 2; do
  "$here/run.sh" "$@"
  rc=$?
  [ $rc = 123 ] && [ $attempt = 1 ] || break
  echo "ctest-run: the virtual wire stalled (qemu, not the code under test); running it again, once"
done
if [ $rc = 77 ]; then echo "ctest-run: 77 failures reported, exiting 78 so that CTest does not read a skip"; rc=78; fi
exit $rc
