#!/usr/bin/env bash
# The device tool sends the session's checkout (not this worktree): this copies the build
# bundle (scripts/gpu-bundle.sh) and the GPU script into <checkout>/persist-bundle/wt, which
# the checkout's .git/info/exclude ignores, to be carried. On the machine:
#   mkdir -p /work; ln -s $PWD/persist-bundle/wt /work/wt-persist; /work/wt-persist/scripts/gpu-persist.sh
#   usage: scripts/persist-bundle.sh CHECKOUT
set -euo pipefail
cd "$(dirname "$0")/.."
dst=$1/persist-bundle/wt
scripts/gpu-bundle.sh build >/dev/null
rm -rf "$1/persist-bundle"
mkdir -p "$dst/scripts"
cp -a gpu-bundle/build "$dst/build"
cp -a scripts/gpu-persist.sh "$dst/scripts/"
du -sh "$1/persist-bundle"
