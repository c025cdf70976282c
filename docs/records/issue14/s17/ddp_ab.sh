#!/bin/bash
# DDP's main job (examples/train_ddp.py: gloo + default DDP beside tuned + tunedist, one torchrun), the worker's
# policy alternating: TUNEDIST_WORKER_SCHED=normal vs batch (the default), K rounds; ORDER="batch normal" runs batch
# first in each round. Usage: [ORDER=...] ddp_ab.sh DIR K
DIR=$1; K=$2; ORDER=${ORDER:-normal batch}
mkdir -p $DIR
(vmstat 5 > $DIR/vmstat.log) & VM=$!
for k in $(seq 1 $K); do
  for v in $ORDER; do
    TUNEDIST_WORKER_SCHED=$v torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --steps 30 \
      --json $DIR/${v}_$k.json > $DIR/${v}_$k.txt 2>&1
  done
done
kill $VM
for v in normal batch; do
  echo "$v tuned samples/s / step ms / exposed comm ms, and tuned/gloo in the same run:"
  for k in $(seq 1 $K); do
    t=$(grep -E '^tuned \+ tunedist' $DIR/${v}_$k.txt | awk '{print $4, $5, $6}')
    g=$(grep -E '^gloo \+ default' $DIR/${v}_$k.txt | awk '{print $5}')
    r=$(grep -E '^tuned / gloo' $DIR/${v}_$k.txt | awk '{print $4}')
    echo "  run $k: $t   $r"
  done
done | tee $DIR/report.txt
