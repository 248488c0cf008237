#!/usr/bin/env bash
# Gives each simulated node of `maco-run --simulate-nodes K` its own GPUs, so that every rank
# has a GPU of its own: maco-run picks a rank's GPU by its local rank (MACO_LOCAL_RANK modulo
# the GPUs it sees), so without this the ranks of every node take GPUs 0, 1, ... and the nodes
# share them. Run as maco-run's program; node k (from MACO_HOST_ID, ".../simulated-node-k")
# sees GPUs k * PER_NODE ... k * PER_NODE + PER_NODE - 1 of those visible to maco-run
# (CUDA_VISIBLE_DEVICES is narrowed, indexes into an existing list are kept).
#   usage: maco-run -n 4 --simulate-nodes 2 --mps off -- scripts/simulated-node-gpus.sh 2 PROGRAM [ARGS...]
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: simulated-node-gpus.sh GPUS_PER_NODE PROGRAM [ARGS...]" >&2
  exit 2
fi
per=$1
shift
node=${MACO_HOST_ID:-}
node=${node##*simulated-node-}
if ! [[ $node =~ ^[0-9]+$ ]]; then
  echo "simulated-node-gpus.sh: MACO_HOST_ID='${MACO_HOST_ID:-}' is not one of maco-run" \
    "--simulate-nodes's (.../simulated-node-K)" >&2
  exit 2
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"
else
  visible=()
  for ((i = 0; i < (node + 1) * per; i++)); do visible+=("$i"); done
fi
if [ $(((node + 1) * per)) -gt ${#visible[@]} ]; then
  echo "simulated-node-gpus.sh: node $node needs GPUs $((node * per))..$(((node + 1) * per - 1))" \
    "but CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES:-}' lists ${#visible[@]}" >&2
  exit 2
fi
mine=$(IFS=,; echo "${visible[*]:node * per:per}")
CUDA_VISIBLE_DEVICES=$mine exec "$@"
