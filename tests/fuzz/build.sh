#!/usr/bin/env bash
# Builds MACO's libFuzzer harnesses (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan, from
# the CPU-only sources of src/host (no CUDA, no CMake): tests/fuzz/build.sh [OUT_DIR]
# OUT_DIR (default build-fuzz, relative to the repository root) gets one binary per harness
# and make_corpus, which writes the seed corpus.
# CC overrides the compiler (default clang); JOBS how many files compile at once (default 2);
# MACO_WERROR=1 turns warnings into errors (CI).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-build-fuzz}"
case "$out" in /*) ;; *) out="$root/$out" ;; esac
cc="${CC:-clang}"
jobs="${JOBS:-2}"
mkdir -p "$out/obj"

# The library sources the harnesses need: the CPU core, without CUDA or the fd server.
lib_sources=(base/status.c base/log.c base/config.c base/sha256.c os/socket.c bootstrap/host_id.c
  bootstrap/alloc.c bootstrap/unique_id.c bootstrap/progress.c bootstrap/handshake.c bootstrap/calls.c
  bootstrap/setup.c bootstrap/env.c bootstrap/launcher.c bootstrap/pmix.c bootstrap/agree.c base/parse.c
  bootstrap/torch_store.c
  memory/mem_handle.c)
harnesses=(fuzz_unique_id fuzz_bootstrap_hello fuzz_link_frames fuzz_mem_handle fuzz_config fuzz_plan fuzz_tcp_wire fuzz_port_hello fuzz_ib_endpoint)
# Execution plans (fuzz_plan): the parser and the verifier, CPU-only (Jansson is loaded at run
# time, MACO_JSON_LIBRARY).
plan_sources=(plan/plan_json.c plan/plan_verify.c plan/plan_verify_structure.c plan/plan_verify_exec.c plan/plan_verify_util.c)
# shellcheck disable=SC2054 # the commas are inside -fsanitize=, not between elements
cflags=(-std=c11 -g -O1 -Wall -Wextra -D_GNU_SOURCE -DMACO_BUILDING_LIBRARY
  "-DMACO_VERSION_STRING=\"fuzz\"" -I"$root/include" -I"$root"
  -fsanitize=address,undefined -fno-sanitize-recover=undefined)
if [[ "${MACO_WERROR:-0}" == 1 ]]; then
  cflags+=(-Werror)
fi

# Library objects are instrumented for coverage, without libFuzzer's main.
pids=()
objs=()
plan_objs=()
for src in "${lib_sources[@]}"; do
  obj="$out/obj/$(basename "${src%.c}").o"
  objs+=("$obj")
  "$cc" "${cflags[@]}" -fsanitize=fuzzer-no-link -c "$root/src/host/$src" -o "$obj" &
  pids+=($!)
  if (( ${#pids[@]} >= jobs )); then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for src in "${plan_sources[@]}"; do
  obj="$out/obj/$(basename "${src%.c}").o"
  plan_objs+=("$obj")
  "$cc" "${cflags[@]}" -fsanitize=fuzzer-no-link -c "$root/algorithms/$src" \
    -o "$obj" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done

for name in "${harnesses[@]}"; do
  extra=()
  [[ "$name" == fuzz_plan ]] && extra=("${plan_objs[@]}" -ldl)
  # The TCP transport's wire format (proxy/transport/tcp/tcp_wire.c): pure, no sockets or CUDA.
  [[ "$name" == fuzz_tcp_wire ]] && extra=("$root/proxy/transport/tcp/tcp_wire.c")
  [[ "$name" == fuzz_port_hello ]] && extra=("$root/proxy/port_wire.c")
  [[ "$name" == fuzz_ib_endpoint ]] && extra=("$root/proxy/transport/ib/ib_wire.c")
  "$cc" "${cflags[@]}" -fsanitize=fuzzer "$root/tests/fuzz/$name.c" "${objs[@]}" "${extra[@]}" \
    -lpthread -o "$out/$name"
done
# The seed corpus writer (make_corpus tests/fuzz/corpus regenerates the committed seeds).
"$cc" "${cflags[@]}" -fsanitize=fuzzer-no-link "$root/tests/fuzz/make_corpus.c" "${objs[@]}" \
  -lpthread -o "$out/make_corpus"
echo "fuzz: built ${harnesses[*]} in $out"
