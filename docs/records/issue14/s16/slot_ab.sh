#!/bin/bash
# usage: slot_ab.sh DIR PAIRS "SLOTS..."  -- alternating runs of the AG/RS bench under different TUNEDIST_SLOT_BYTES
DIR=$1; K=$2; SLOTS=${3:-"1048576 262144"}
mkdir -p $DIR
export PYTHONPATH=/work/main/python
vmstat 5 > $DIR/vmstat.log & VM=$!
for k in $(seq 1 $K); do
  for s in $SLOTS; do
    TUNEDIST_SLOT_BYTES=$s torchrun --standalone --nproc_per_node=2 -m tunedist.bench --backends tuned \
      --ops all_gather,reduce_scatter -b 64K -e 16M -f 4 --rounds 3 --no-progress --json $DIR/slot${s}_run$k.json > $DIR/slot${s}_run$k.log 2>&1
  done
done
kill $VM
