# Sourced (not run) by the scripts/gpu-*.sh that run on a lent GPU machine from the checkout's
# root: $OUT for the logs, the carried build as $B (build/, else gpu-bundle/build: copied by
# scripts/gpu-bundle.sh, or scripts/gpu-pack.sh's build.tgz, unpacked here when needed),
# ctest's absolute paths of the build machine made to resolve here, NCCL_NVLS_ENABLE=0, and
# step NAME TIMEOUT COMMAND...: runs COMMAND into $OUT/NAME.txt and adds a summary line (rc,
# seconds, the last PASSED/FAILED/wrong-values line) to $summary.
if [ ! -e build ] && [ ! -d gpu-bundle/build ] && [ -f gpu-bundle/build.tgz ]; then
  tar xzf gpu-bundle/build.tgz -C gpu-bundle || exit 1
fi
OUT=${OUT:-/tmp/maco-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=build
if [ ! -e "$B" ] && [ -d gpu-bundle/build ]; then ln -s gpu-bundle/build "$B"; fi
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"
fi
summary=()
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-3d %4ds  %s' "$name" "$rc" $(( $(date +%s) - t0 )) \
    "$(grep -E 'PASSED|FAILED|tests passed|Wrong values' "$OUT/$name.txt" | tail -1)")")
  return 0
}
