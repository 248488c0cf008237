#!/usr/bin/env bash
# Installs what building and testing MACO needs, where it is missing, from Debian/Ubuntu
# packages (apt-get, as root or through sudo), and says what it installs and why. The CUDA
# toolkit (nvcc) must already be installed; this script says so when it is not.
#   usage: scripts/setup.sh [build]
# `build` (scripts/bench.sh): only what configuring and building the library and the tools
# needs. Without it (scripts/test.sh): also what the tests need, listed below.
#
# Not installed here, because only some tests need them and they are large: the first test run
# (scripts/test.sh, ctest) also
#   - makes a Python virtual environment for the Python tests in ~/.cache/maco
#     (tests/python/run.sh), from the package index, unless python3 already has what they
#     need: pytest, numpy, scikit-build-core and nanobind (about 110 MB) and PyTorch (about
#     5 GB). PYTEST_TORCH=0 leaves torch out: the torch tests then skip, naming the switch;
#   - installs qemu and rdma-core's tools (apt, as root) and downloads a Debian guest kernel
#     (about 400 MB, in ~/.cache/maco-ibvm) for the IB transport's soft-RoCE VM tests
#     (tests/ibvm). IBVM_RUN=0 skips those tests, naming the switch.
# Installed here, for the launcher tests: Open MPI (openmpi-bin), the PMIx runtime (libpmix2,
# libpmix-dev for Slurm's mpi/pmix plugin), Slurm (slurmctld, slurmd, slurm-client) and munge;
# the tests start their own one-host Slurm with its own munged in a temporary folder.
# Downloaded here, once: the headers of NVIDIA's NCCL wheels (nvidia-nccl-cu13, about 200 MB
# each, headers only kept, about 1 MB, in ~/.cache/maco/nccl-<version>/include): 2.32.6's, which
# MACO's libnccl.so.2 is built from, and 2.28.9's, which its compatibility test builds an old
# client against; skipped where a header of that version is found already (NCCL_HOME, the
# python3 on PATH, the CUDA toolkit, /usr/include, /usr/local/include). Without them the library
# (or the test) is left out and the configure summary says so.
# CI (.ci/run) runs everything: there a skipped VM, torch or launcher test fails the run.
set -euo pipefail
mode=${1:-test}
case $mode in
  build | test) ;;
  *)
    echo "usage: $0 [build]  (build: only what building needs; default: what the tests need too)" >&2
    exit 2
    ;;
esac

need=()
why=()
want() { # package reason
  need+=("$1")
  why+=("$1: $2")
}
command -v cc >/dev/null 2>&1 || want build-essential "the C compiler (libmaco, the tools, the examples)"
command -v c++ >/dev/null 2>&1 || want g++ "the C++ compiler (tests, the Python extension)"
command -v cmake >/dev/null 2>&1 || want cmake "the build (3.25 or newer)"
command -v ninja >/dev/null 2>&1 || want ninja-build "the build's generator"
if [ ! -e /usr/include/gtest/gtest.h ] && [ ! -e /usr/local/include/gtest/gtest.h ]; then
  want libgtest-dev "GoogleTest: the C and C++ tests (configure looks for it while MACO_BUILD_TESTS is ON)"
fi
# rdma-core's verbs header: the IB transport is compiled against it (libibverbs itself is
# loaded at run time, only where it is installed).
[ -e /usr/include/infiniband/verbs.h ] || want libibverbs-dev "rdma-core's verbs header: the IB transport (left out without it)"
# Jansson's header: plans are read with it (loaded at run time, libjansson4 beside it).
[ -e /usr/include/jansson.h ] || want libjansson-dev "Jansson's header: plans are read with it (configure stops without it)"
if [ "$mode" = test ]; then
  command -v make >/dev/null 2>&1 || want make "the examples' Makefile (install test)"
  command -v pkg-config >/dev/null 2>&1 || want pkg-config "maco.pc, used by the install test and the Quick start"
  command -v readelf >/dev/null 2>&1 || want binutils "readelf: the linkage and install tests"
  command -v ip >/dev/null 2>&1 || want iproute2 "ip: the TCP tests across network namespaces"
  command -v clang-format >/dev/null 2>&1 || want clang-format "the format test (it skips without it)"
  command -v valgrind >/dev/null 2>&1 || want valgrind "memcheck of the survivors of the fault-tolerance tests (comm_ft_valgrind skips without it)"
  command -v ccache >/dev/null 2>&1 || want ccache "CI's two sanitizer builds share their CUDA objects through it"
  command -v cppcheck >/dev/null 2>&1 || want cppcheck "static analysis of the C code (scripts/check_static.sh, CI)"
  command -v abidiff >/dev/null 2>&1 || want abigail-tools "abidw/abidiff: the ABI check of libmaco.so.0 and libnccl.so.2 (ctest abi)"
  if ! command -v python3 >/dev/null 2>&1; then
    want python3 "the Python tests, the layers and plans tests"
    want python3-venv "the Python tests' virtual environment (tests/python/run.sh)"
    want python3-dev "Python.h: the Python extension, built by the Python tests"
    want python3-jsonschema "the plans test checks the shipped plans against their JSON Schema"
  else
    # The Python package's tests make a virtual environment (tests/python/run.sh).
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 ||
      want python3-venv "the Python tests' virtual environment (tests/python/run.sh)"
    python3 -c 'import os, sysconfig; os.stat(sysconfig.get_paths()["include"] + "/Python.h")' \
      >/dev/null 2>&1 || want python3-dev "Python.h: the Python extension, built by the Python tests"
    python3 -c 'import jsonschema' >/dev/null 2>&1 ||
      want python3-jsonschema "the plans test checks the shipped plans against their JSON Schema"
  fi
  # The launcher tests (tests/launchers/run.sh, tests/python/test_launchers.py) start MACO jobs
  # with the real launchers; without these packages they skip and say so (CI requires them).
  command -v mpirun >/dev/null 2>&1 || want openmpi-bin "Open MPI's mpirun: the launcher tests start jobs with it"
  ldconfig -p 2>/dev/null | grep 'libpmix\.so\.2 ' >/dev/null ||
    want libpmix2 "the PMIx runtime: MACO passes the unique id through mpirun's and srun's PMIx server (loaded at run time)"
  if command -v dpkg-query >/dev/null 2>&1 &&
    ! dpkg-query -W -f='${Status}' libpmix-dev 2>/dev/null | grep -q 'ok installed'; then
    want libpmix-dev "Slurm's mpi/pmix plugin loads the unversioned libpmix.so it ships (srun --mpi=pmix in the launcher tests)"
  fi
  for p in slurmctld slurmd; do
    command -v $p >/dev/null 2>&1 || want $p "a one-host Slurm cluster the launcher tests start and stop themselves"
  done
  command -v srun >/dev/null 2>&1 || want slurm-client "srun and sbatch: the launcher tests run jobs with them"
  command -v munged >/dev/null 2>&1 || want munge "Slurm's authentication (the launcher tests start a private munged)"
fi
python3 -m pip --version >/dev/null 2>&1 ||
  want python3-pip "pip download: the nccl.h of NVIDIA's NCCL wheels (MACO's libnccl.so.2)"
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}:"
  printf '  %s\n' "${why[@]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
  else
    echo "setup: please install ${need[*]} (no apt-get here)" >&2
    exit 1
  fi
fi

cmake_version=$(cmake --version | head -n1 | sed 's/[^0-9.]*\([0-9.]*\).*/\1/')
if [ "$(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -n1)" != "3.25" ]; then
  echo "setup: CMake $cmake_version is older than 3.25; install a newer one (pip install cmake)" >&2
  exit 1
fi
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if [ -x "$d/nvcc" ]; then
      echo "setup: nvcc is in $d; add it to PATH (export PATH=$d:\$PATH)" >&2
      exit 1
    fi
  done
  echo "setup: the CUDA toolkit (nvcc) is required: https://developer.nvidia.com/cuda-downloads" >&2
  exit 1
fi

# nccl_header VERSION: prints the first folder whose nccl.h is of NCCL VERSION (x.y.z) among
# those nccl/CMakeLists.txt searches (but MACO_NCCL_INCLUDE_DIR, a CMake setting); nothing
# when there is none.
nccl_header() {
  local code d
  code=$(echo "$1" | awk -F. '{ print $1 * 10000 + $2 * 100 + $3 }')
  for d in ${NCCL_HOME:+"$NCCL_HOME/include"} \
    "$(python3 -c 'import os, nvidia.nccl; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)" \
    "$HOME/.cache/maco/nccl-$1/include" "$(dirname "$(command -v nvcc)")/../include" \
    /usr/include /usr/local/include; do
    if [ -n "$d" ] && grep -qs "^#define NCCL_VERSION_CODE $code\$" "$d/nccl.h"; then
      echo "$d"
      return
    fi
  done
}
# nccl_fetch VERSION: unpacks the headers of NVIDIA's nvidia-nccl-cu13 wheel of that version
# into ~/.cache/maco/nccl-VERSION/include (the wheel itself is not kept). Returns 1, saying
# why, when pip cannot get it (offline: the library, or its compatibility test, is left out).
nccl_fetch() {
  local dest="$HOME/.cache/maco/nccl-$1" tmp
  tmp=$(mktemp -d)
  echo "setup: downloading nvidia-nccl-cu13==$1 (about 200 MB) for its nccl.h, into $dest"
  if ! python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
      -d "$tmp" "nvidia-nccl-cu13==$1"; then
    rm -rf "$tmp"
    echo "setup: could not download nvidia-nccl-cu13==$1 (see pip's message above)" >&2
    return 1
  fi
  rm -rf "$dest"
  python3 - "$tmp"/nvidia_nccl_cu13-*.whl "$dest" <<'PY'
import os, shutil, sys, zipfile
prefix = "nvidia/nccl/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(sys.argv[2], "include", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
  [ -e "$dest/include/nccl.h" ] || { echo "setup: the wheel of $1 has no nvidia/nccl/include/nccl.h" >&2; return 1; }
}
nccl_missing=()
for v in 2.32.6 2.28.9; do
  if [ -z "$(nccl_header $v)" ] && ! nccl_fetch $v; then
    nccl_missing+=("$v")
  fi
done
if [ ${#nccl_missing[@]} -gt 0 ]; then
  echo "setup: no nccl.h of NCCL ${nccl_missing[*]}: MACO's libnccl.so.2 (2.32.6) or its" \
    "compatibility test (2.28.9) will be left out (configure with -DMACO_REQUIRE_NCCL=ON to" \
    "make that an error)" >&2
fi
echo "setup: ok (cmake $cmake_version, $(nvcc --version | tail -n1))"
[ "$mode" = test ] || exit 0
# What the first test run fetches besides these packages (tests/python/run.sh, tests/ibvm).
if [ "${PYTEST_TORCH:-1}" = 0 ]; then
  echo "setup: the first test run makes a Python environment without PyTorch (about 110 MB," \
    "~/.cache/maco; none when python3 has pytest, numpy, scikit-build-core and nanobind);" \
    "the torch tests skip (PYTEST_TORCH=0)"
else
  echo "setup: the first test run makes a Python environment with PyTorch (about 5 GB," \
    "~/.cache/maco; PYTEST_TORCH=0 leaves torch out: about 110 MB)"
fi
if [ "${IBVM_RUN:-1}" = 0 ]; then
  echo "setup: the soft-RoCE VM tests skip (IBVM_RUN=0)"
else
  echo "setup: the first test run installs qemu and downloads a guest kernel for the soft-RoCE" \
    "VM tests (about 400 MB, ~/.cache/maco-ibvm; IBVM_RUN=0 skips them)"
fi
