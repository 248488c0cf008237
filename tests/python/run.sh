#!/usr/bin/env bash
# ctest's python_cpu and python_gpu: the maco package's pytest suite.
#   usage: tests/python/run.sh BUILD_DIR [--gpu] [PYTEST ARGS...]
# 1. A virtual environment with requirements.txt (and requirements-torch.txt unless
#    PYTEST_TORCH=0), made once and kept in PYTEST_VENV (default:
#    ~/.cache/maco/pytest-venv-<python version>), so later runs install nothing.
# 2. pip installs python-bindings/ against this build's libmaco: `cmake --install` copies it
#    into BUILD_DIR/python/prefix and the package finds it through CMake, so only the
#    extension compiles (incrementally, in BUILD_DIR/python/build); the C library is not
#    built a second time.
# 3. pytest. Without --gpu the CPU suite runs with no visible GPU (CUDA_VISIBLE_DEVICES=""),
#    so it tests the same paths on a GPU machine as in CI; --gpu exits 77 (ctest's skip)
#    with the reason when no GPU is usable.
# PYTEST_PYTHON picks the interpreter (default python3).
set -euo pipefail
build=$(cd "$1" && pwd)
shift
gpu=0
if [ "${1:-}" = "--gpu" ]; then
  gpu=1
  shift
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTEST_PYTHON:-python3}
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv=${PYTEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/maco/pytest-venv-$pyver}
mkdir -p "$(dirname "$venv")"
(
  flock 9
  if [ ! -x "$venv/bin/python" ]; then
    echo "run.sh: creating $venv"
    "$py" -m venv "$venv"
  fi
  reqs=("$src/tests/python/requirements.txt")
  [ "${PYTEST_TORCH:-1}" = "0" ] || reqs+=("$src/tests/python/requirements-torch.txt")
  want=$(cat "${reqs[@]}")
  if [ "$want" != "$(cat "$venv/.maco-requirements" 2>/dev/null)" ]; then
    echo "run.sh: installing $(grep -hv '^#' "${reqs[@]}" | tr '\n' ' ')"
    args=()
    for r in "${reqs[@]}"; do args+=(-r "$r"); done
    "$venv/bin/pip" install -q --disable-pip-version-check "${args[@]}"
    printf '%s' "$want" > "$venv/.maco-requirements"
  fi
) 9> "$(dirname "$venv")/.pytest-venv.lock"

cmake --install "$build" --prefix "$build/python/prefix" > /dev/null
start=$(date +%s)
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall "$src/python-bindings" \
  -Ccmake.define.CMAKE_PREFIX_PATH="$build/python/prefix" -Cbuild-dir="$build/python/build"
echo "run.sh: maco package installed in $(( $(date +%s) - start )) s"

if [ $gpu = 0 ]; then
  export CUDA_VISIBLE_DEVICES=""
else
  why=$("$venv/bin/python" -c 'import maco; n, why = maco.cuda_device_count(); print("" if n else why)')
  if [ -n "$why" ]; then
    echo "SKIP: no GPU: $why"
    exit 77
  fi
fi
cd "$src/tests/python"
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$@"
