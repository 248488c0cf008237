#!/usr/bin/env bash
# Installs what building and testing MACO needs, where it is missing: a C/C++ compiler,
# CMake >= 3.25, Ninja, make, pkg-config, GoogleTest, rdma-core's verbs header
# (libibverbs-dev), Jansson's header (libjansson-dev) and python3-jsonschema (Debian/Ubuntu
# packages). The CUDA toolkit (nvcc) must already be installed; this script says so when it
# is not.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v readelf >/dev/null 2>&1 || need+=(binutils)
command -v make >/dev/null 2>&1 || need+=(make)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v ip >/dev/null 2>&1 || need+=(iproute2) # the TCP tests across network namespaces
# The Python package's tests make a virtual environment (tests/python/run.sh).
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if ! command -v cmake >/dev/null 2>&1; then
  need+=(cmake)
fi
if [ ! -e /usr/include/gtest/gtest.h ] && [ ! -e /usr/local/include/gtest/gtest.h ]; then
  need+=(libgtest-dev)
fi
# rdma-core's verbs header: the IB transport is compiled against it (libibverbs itself is
# loaded at run time, only where it is installed).
if [ ! -e /usr/include/infiniband/verbs.h ]; then
  need+=(libibverbs-dev)
fi
# Jansson's header: plans are read with it (loaded at run time, libjansson4 beside it).
if [ ! -e /usr/include/jansson.h ]; then
  need+=(libjansson-dev)
fi
# The plans test validates the shipped plans against their JSON Schema.
python3 -c 'import jsonschema' >/dev/null 2>&1 || need+=(python3-jsonschema)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
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
echo "setup: ok (cmake $cmake_version, $(nvcc --version | tail -n1))"
