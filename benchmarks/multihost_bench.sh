#!/usr/bin/env bash
# Hierarchical `tuned` all_reduce against flat gloo over the same ranks, on 2 simulated hosts x 2 ranks: two
# torchruns on this machine (--nnodes=2, one c10d rendezvous on 127.0.0.1), each with its own TUNEDIST_HOST_ID.
# Both backends are measured in the same run (tunedist.bench); the node with global rank 0 prints the tables.
#   benchmarks/multihost_bench.sh [out.json] [extra tunedist.bench arguments...]
set -euo pipefail
out=${1:-multihost_bench.json}
shift || true
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run_node() {
  local node=$1
  shift
  TUNEDIST_HOST_ID=host$node python3 -m torch.distributed.run --nnodes=2 --node-rank="$node" --nproc-per-node=2 \
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:"$port" --rdzv-id=tunedist-multihost-bench --max-restarts=0 \
    -m tunedist.bench --backends tuned,gloo --ops all_reduce -b 1M -e 64M -f 4 --no-progress "$@"
}
uptime
# The c10d rendezvous numbers the nodes in arrival order: whichever holds global rank 0 prints and writes $out.
run_node 1 --json "$out" "$@" > "$out.node1.log" 2>&1 &
node1=$!
trap 'kill $node1 2>/dev/null || true' EXIT
run_node 0 --json "$out" "$@" > "$out.node0.log" 2>&1
wait $node1
grep -h -v '^W[0-9]' "$out.node0.log" "$out.node1.log" | grep -v '^\*\*\*\|OMP_NUM_THREADS' || true
uptime
