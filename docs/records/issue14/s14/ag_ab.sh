#!/bin/bash
# base/new alternating K times; one JSON line per run in $D/{base,new}.jsonl
D=$1; K=${2:-7}; SIZES=${3:-65536,262144,1048576,4194304,16777216}; mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
for i in $(seq $K); do for b in ${ORDER:-base new}; do
  pp=/work/s14/base/python; [ $b = new ] && pp=/work/main/python
  echo "$(date +%T) $b run$i load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
  PYTHONPATH=$pp torchrun --standalone --nproc_per_node=2 /work/s14/ag_ab.py $SIZES 2>/dev/null | tail -1 >> $D/$b.jsonl
done; done
kill $VM
