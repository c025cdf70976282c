#!/bin/bash
# ab_budget.sh DIR K: alternate base/new bench_call_budget runs K times each
D=$1; K=$2; SIZES=${SIZES:-4K,16K}
export DS_ACCELERATOR=cpu LOCAL_SIZE=2
for i in $(seq 1 $K); do
  for b in ${ORDER:-base new}; do
    if [ $b = base ]; then PP=/work/s14/base/python; else PP=/work/main/python; fi
    echo "$(date +%T) $b run$i load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
    PYTHONPATH=$PP torchrun --standalone --nproc_per_node=2 /work/main/benchmarks/bench_call_budget.py --sizes $SIZES --rounds 5 --no-gloo --json $D/${b}_$i.json > $D/${b}_$i.log 2>&1
  done
done
