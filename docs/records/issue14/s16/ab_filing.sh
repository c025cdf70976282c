#!/bin/bash
# filing (09f0ce0) vs current, alternating (order flips each pair), stale and fresh inputs; bench_ab_builds.py JSON per run
D=$1; K=${2:-5}; mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
B=/work/main/benchmarks/bench_ab_builds.py
for i in $(seq $K); do
  if [ $((i % 2)) = 1 ]; then ORD="filing current"; else ORD="current filing"; fi
  for mode in stale fresh; do for b in $ORD; do
    pp=/work/s16/filing/python; [ $b = current ] && pp=/work/main/python
    extra=""; [ $mode = fresh ] && extra="--fresh"
    echo "$(date +%T) $b $mode run$i load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
    PYTHONPATH=$pp torchrun --standalone --nproc_per_node=2 $B $extra --json $D/${b}_${mode}_run$i.json > $D/${b}_${mode}_run$i.log 2>&1
  done; done
done
kill $VM
for mode in stale fresh; do
  A=$(ls $D/filing_${mode}_run*.json | paste -sd,); C=$(ls $D/current_${mode}_run*.json | paste -sd,)
  python3 $B --compare $A $C > $D/filing_vs_current_$mode.txt
done
