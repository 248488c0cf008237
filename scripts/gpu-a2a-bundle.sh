#!/usr/bin/env bash
# Copies what scripts/gpu-a2a.sh needs from a build folder into DEST (default
# ../main/build-a2a-bundle, which main's .gitignore ignores: /build*/), small enough to travel
# with the device tool: the library, the CUDA runtime the test binaries load, maco-run,
# maco-perf, the test binaries and the script.
#   usage: scripts/gpu-a2a-bundle.sh [BUILD_DIR] [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build}
dst=${2:-../main/build-a2a-bundle}
rm -rf "$dst"
mkdir -p "$dst/tests" "$dst/tools"
cp -a "$src"/libmaco.so* "$dst/"
cp -aL /usr/local/cuda/lib/libcudart.so.13 "$dst/" 2>/dev/null || cp -aL "$(dirname "$(command -v nvcc)")/../lib64/libcudart.so.13" "$dst/"
cp -a "$src/tests/test_gpu_mp" "$src/tests/test_group_mp" "$dst/tests/"
cp -a "$src/tools/maco-run" "$src/tools/maco-perf" "$src/tools/maco-info" "$dst/tools/"
cp -a scripts/gpu-a2a.sh "$dst/"
du -sh "$dst" | sed 's/^/bundle: /'
