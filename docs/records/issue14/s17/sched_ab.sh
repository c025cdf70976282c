#!/bin/bash
# The worker's scheduling policy, A/B in one build: TUNEDIST_WORKER_SCHED=normal vs batch (the default), alternating,
# K rounds, bench_call_budget at NP ranks (default 2). Usage: sched_ab.sh DIR K
DIR=$1; K=$2
mkdir -p $DIR
(vmstat 5 > $DIR/vmstat.log) & VM=$!
for k in $(seq 1 $K); do
  for v in normal batch; do
    TUNEDIST_WORKER_SCHED=$v torchrun --standalone --nproc_per_node=${NP:-2} benchmarks/bench_call_budget.py \
      --sizes 4K,16K,64K --rounds 3 --no-gloo --no-deepspeed --json $DIR/${v}_$k.json > $DIR/${v}_$k.txt 2>&1
  done
done
kill $VM
