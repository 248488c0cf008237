#!/usr/bin/env bash
# ctest's python_cpu and python_gpu: the maco package's pytest suite.
#   usage: tests/python/run.sh BUILD_DIR [--gpu] [PYTEST ARGS...]
#
# Offline first: nothing is fetched when what the tests need is already installed.
#
# 1. What the tests need: requirements.txt (pytest, numpy, and scikit-build-core and nanobind
#    to build the package) and requirements-torch.txt (torch; PYTEST_TORCH=0 leaves it out:
#    the torch tests then skip and say so, and no multi-GB environment is made for it).
#    scikit-build-core and nanobind are not needed when a maco wheel is carried (step 3).
# 2. Where it comes from:
#    a. The interpreter (PYTEST_PYTHON, default python3) as it is, when it has every package
#       at the version asked for (checked without importing them): nothing is installed into
#       it and no virtual environment is made. GPU machines and clusters take this path.
#    b. Otherwise a virtual environment in PYTEST_VENV (default
#       ~/.cache/maco/pytest-venv-<python version>), made once and kept, that sees the
#       interpreter's packages (--system-site-packages; when the interpreter is itself a
#       venv's, its site-packages too), where pip installs only what is missing: from
#       PYTEST_WHEELS=DIR with --no-index when set (wheels carried to an offline machine:
#       `pip download -d DIR -r tests/python/requirements.txt` elsewhere, same Python and
#       platform), else from the package index (CI). When that fails, run.sh exits 1 naming
#       each missing package and the remedies.
#    The switches are PYTEST_* rather than MACO_*: libmaco warns about MACO_* variables it
#    does not know (config table), and the tests fail on unexpected warnings.
# 3. The maco package goes to BUILD_DIR/python/site (put first on PYTHONPATH), never into the
#    interpreter or the venv: a maco-*.whl in PYTEST_WHEELS is installed as it is (built
#    elsewhere against this build's libmaco, e.g. the cp312 wheel of
#    docs/multi-gpu-runbook.md, for a machine that only has the carried build); otherwise pip
#    builds python-bindings/ against this build's libmaco: `cmake --install` copies it into
#    BUILD_DIR/python/prefix and the package finds it through CMake, so only the extension
#    compiles (incrementally, in BUILD_DIR/python/build-<python version>); the C library is
#    not built again.
# 4. pytest. Without --gpu the CPU suite runs with no visible GPU (CUDA_VISIBLE_DEVICES=""),
#    so it tests the same paths on a GPU machine as in CI; --gpu exits 77 (ctest's skip)
#    with the reason when no GPU is usable.
set -euo pipefail
build=$(cd "$1" && pwd)
shift
gpu=0
if [ "${1:-}" = "--gpu" ]; then
  gpu=1
  shift
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
here=$src/tests/python
py=${PYTEST_PYTHON:-python3}
wheels=${PYTEST_WHEELS:-}
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || { echo "run.sh: PYTEST_WHEELS=$wheels is not a folder" >&2; exit 1; }
  wheels=$(cd "$wheels" && pwd)
fi
maco_whl=
if [ -n "$wheels" ]; then
  maco_whl=$(ls -t "$wheels"/maco-*.whl 2>/dev/null | head -1 || true)
fi

reqs=("$here/requirements.txt")
[ "${PYTEST_TORCH:-1}" = "0" ] || reqs+=("$here/requirements-torch.txt")
# The requirements an interpreter lacks (or has too old), one per line; prints nothing when
# it has them all. Reads the installed distributions' metadata, imports nothing. When a maco
# wheel is carried (MISSING_BUILD=0), scikit-build-core and nanobind are not needed.
missing() { # python
  MISSING_BUILD=$([ -n "$maco_whl" ] && echo 0 || echo 1) "$1" - "${reqs[@]}" <<'EOF'
import importlib.metadata as md, importlib.util, os, re, sys
build_only = {"scikit-build-core", "nanobind"}
def vers(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?", line)
        if m is None:
            sys.exit(f"run.sh: cannot read the requirement {line!r} in {path}")
        name, least = m.group(1), m.group(2)
        if name in build_only and os.environ["MISSING_BUILD"] == "0":
            continue
        module = name.replace("-", "_")
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is None or importlib.util.find_spec(module) is None or (
                least and vers(have) < vers(least)):
            print(line)
EOF
}

need=$(missing "$py")
if [ -z "$need" ]; then
  run_py=$(command -v "$py")
  echo "run.sh: using $run_py and its installed packages (nothing installed)"
else
  pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=${PYTEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/maco/pytest-venv-$pyver}
  echo "run.sh: $py lacks $(echo $need); using the virtual environment $venv"
  mkdir -p "$(dirname "$venv")"
  (
    flock 9
    if [ ! -x "$venv/bin/python" ]; then
      echo "run.sh: creating $venv (it sees $py's packages)"
      "$py" -m venv --system-site-packages "$venv"
      # A venv made from a venv's interpreter sees the base installation, not that venv:
      # point at its site-packages too.
      purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      "$py" -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("\n".join(site.getsitepackages()))' > "$purelib/maco-parent-venv.pth"
    fi
    still=$(missing "$venv/bin/python")
    if [ -n "$still" ]; then
      from=()
      if [ -n "$wheels" ]; then
        from=(--no-index --find-links "$wheels")
        echo "run.sh: installing $(echo $still) from $wheels (no network)"
      else
        echo "run.sh: installing $(echo $still) from the package index"
      fi
      mapfile -t still_a <<< "$still"
      "$venv/bin/pip" install -q --disable-pip-version-check "${from[@]}" "${still_a[@]}" || true
      still=$(missing "$venv/bin/python")
      if [ -n "$still" ]; then
        where="from the package index (no network?)"
        [ -z "$wheels" ] || where="from PYTEST_WHEELS=$wheels"
        {
          echo "run.sh: FAILED: the Python tests need $(echo $still): neither $py nor $venv"
          echo "  has it, and pip could not install it $where. Remedies, any one:"
          echo "  - install into the interpreter, which run.sh then uses as it is:"
          echo "      $py -m pip install $(printf "'%s' " $still)"
          echo "    (or PYTEST_PYTHON=an interpreter that has them);"
          echo "  - carry wheels: on a machine with network, for the same Python and platform,"
          echo "      pip download -d DIR $(printf "'%s' " $still)"
          echo "    then PYTEST_WHEELS=DIR (installed with --no-index);"
          echo "  - PYTEST_TORCH=0 runs the tests without torch (its tests skip); a maco-*.whl in"
          echo "    PYTEST_WHEELS removes the need for scikit-build-core and nanobind."
        } >&2
        exit 1
      fi
    fi
  ) 9> "$(dirname "$venv")/.pytest-venv.lock"
  run_py=$venv/bin/python
fi

site=$build/python/site
rm -rf "$site"
start=$(date +%s)
if [ -n "$maco_whl" ]; then
  "$run_py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --target "$site" "$maco_whl"
  echo "run.sh: maco installed from the carried wheel $maco_whl (not built from python-bindings/)"
else
  if [ ! -f "$build/cmake_install.cmake" ]; then
    echo "run.sh: FAILED: $build has no cmake_install.cmake (a carried bundle of a build?), so" \
      "the package cannot be built against it here: put its wheel (built where the build was" \
      "made, docs/multi-gpu-runbook.md) in PYTEST_WHEELS=DIR" >&2
    exit 1
  fi
  cmake --install "$build" --prefix "$build/python/prefix" > /dev/null
  pyver=$("$run_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  "$run_py" -m pip install -q --disable-pip-version-check --no-index --no-build-isolation \
    --no-deps --target "$site" "$src/python-bindings" \
    -Ccmake.define.CMAKE_PREFIX_PATH="$build/python/prefix" -Cbuild-dir="$build/python/build-$pyver"
  echo "run.sh: maco built and installed in $site in $(( $(date +%s) - start )) s"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

if [ $gpu = 0 ]; then
  export CUDA_VISIBLE_DEVICES=""
else
  why=$("$run_py" -c 'import maco; n, why = maco.cuda_device_count(); print("" if n else why)')
  if [ -n "$why" ]; then
    echo "SKIP: no GPU: $why"
    exit 77
  fi
fi
cd "$here"
exec "$run_py" -m pytest -q -rs -p no:cacheprovider "$@"
