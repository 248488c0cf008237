#!/usr/bin/env bash
# Copies what the GPU machine needs from a build folder (the library, tools, test and
# benchmark binaries, ctest's files) into gpu-bundle/build, small enough to travel with the
# device tool (its 64 MiB limit; the whole build folder is larger). scripts/gpu-common.sh
# uses gpu-bundle/build there when no build folder came along.
#   usage: scripts/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build}
dst=gpu-bundle/build
rm -rf gpu-bundle
mkdir -p "$dst/tests" "$dst/tools"
cp -a "$src/CMakeCache.txt" "$src/CTestTestfile.cmake" "$src"/libmaco.so* "$dst/"
cp -a "$src/tests/CTestTestfile.cmake" "$dst/tests/"
[ -f "$src/tools/CTestTestfile.cmake" ] && cp -a "$src/tools/CTestTestfile.cmake" "$dst/tools/"
for f in "$src"/tests/* "$src"/tools/*; do
  [ -f "$f" ] && [ -x "$f" ] && cp -a "$f" "$dst/${f#"$src"/}"
done
# Jansson (plans are read with it): the GPU machine may not have it; libmaco looks next to
# itself when the system has none.
for j in /usr/lib/x86_64-linux-gnu/libjansson.so.4 /usr/lib64/libjansson.so.4; do
  [ -e "$j" ] && cp -L "$j" "$dst/libjansson.so.4" && break
done
du -sh gpu-bundle | sed 's/^/gpu-bundle: /'
