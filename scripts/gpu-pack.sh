#!/usr/bin/env bash
# Packs a build and the Python package's wheel into gpu-bundle/: what scripts/gpu-verify.sh
# and the scripts it forwards to (gpu-perf.sh, gpu-nodes-apps.sh, gpu-clients.sh) need on the
# GPU machine, within the device tool's carry (64 MiB in all). The build is
# scripts/gpu-bundle.sh's files plus MACO's libnccl (nccl/) and its test binaries and ctest
# file (tests/nccl), packed as gpu-bundle/build.tgz (the libraries compress about 3:1; unpacked
# they pass the limit); the wheel goes to gpu-bundle/whl/ (a cp312 abi3 wheel shipping the
# same libmaco: see docs/multi-gpu-runbook.md for the command that builds it). The GPU scripts
# unpack build.tgz on the machine. scripts/gpu-bundle.sh alone leaves the build unpacked in
# gpu-bundle/build, without MACO's libnccl and without a wheel.
#   usage: scripts/gpu-pack.sh [BUILD_DIR] [WHEEL]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build}
whl=${2:-}
[ -f "$src/nccl/libmaco_nccl.so" ] || {
  echo "gpu-pack.sh: no $src/nccl/libmaco_nccl.so (MACO's libnccl is needed)" >&2
  exit 1
}
[ -z "$whl" ] || [ -f "$whl" ] || { echo "gpu-pack.sh: no wheel $whl" >&2; exit 1; }
scripts/gpu-bundle.sh "$src" > /dev/null
dst=gpu-bundle/build
mkdir -p "$dst/nccl" "$dst/tests/nccl"
cp -a "$src"/nccl/libmaco_nccl.so "$src"/nccl/libnccl.so.2 "$dst/nccl/"
cp -a "$src/tests/nccl/CTestTestfile.cmake" "$dst/tests/nccl/"
for f in "$src"/tests/nccl/*; do
  [ -f "$f" ] && [ -x "$f" ] && cp -a "$f" "$dst/tests/nccl/"
done
tar czf gpu-bundle/build.tgz -C gpu-bundle build
rm -rf "$dst"
if [ -n "$whl" ]; then
  mkdir -p gpu-bundle/whl
  cp "$whl" gpu-bundle/whl/
else
  echo "gpu-pack.sh: no wheel given: the apps stage's maco backend and the fused" \
    "stage need one (gpu-bundle/whl/*.whl)" >&2
fi
kib=$(du -sk gpu-bundle | cut -f1)
echo "gpu-bundle: $((kib / 1024)) MiB ($(cd gpu-bundle && find . -type f | sort | tr '\n' ' '))"
if [ "$kib" -gt $((60 * 1024)) ]; then
  echo "gpu-pack.sh: gpu-bundle/ is over 60 MiB; the device tool carries 64 MiB in all" >&2
  exit 1
fi
