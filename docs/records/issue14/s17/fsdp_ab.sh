#!/bin/bash
# FSDP2 steps (benchmarks/bench_fsdp_symmetric.py, plain and symmetric configurations in one job), the worker's policy
# alternating: TUNEDIST_WORKER_SCHED=normal vs batch (the default), order flipping each round, K rounds.
# Usage: fsdp_ab.sh DIR K [bench args...]
DIR=$1; K=$2; shift 2
mkdir -p $DIR
(vmstat 5 > $DIR/vmstat.log) & VM=$!
for k in $(seq 1 $K); do
  if [ $((k % 2)) = 1 ]; then ORD="normal batch"; else ORD="batch normal"; fi
  for v in $ORD; do
    TUNEDIST_WORKER_SCHED=$v torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp_symmetric.py --no-memory \
      "$@" --json $DIR/${v}_$k.json > $DIR/${v}_$k.txt 2>&1
  done
done
kill $VM
