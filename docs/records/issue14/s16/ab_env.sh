#!/bin/bash
# current build, env A vs env B alternating (order flips each pair); stale inputs; bench_ab_builds.py JSON per run
D=$1; K=$2; A="$3"; B="$4"; mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
S=/work/main/benchmarks/bench_ab_builds.py
for i in $(seq $K); do
  if [ $((i % 2)) = 1 ]; then ORD="a b"; else ORD="b a"; fi
  for c in $ORD; do
    e="$A"; [ $c = b ] && e="$B"
    echo "$(date +%T) $c ($e) run$i load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
    env $e PYTHONPATH=/work/main/python torchrun --standalone --nproc_per_node=2 $S --sizes ${SIZES:-64K,256K,1M,4M} --json $D/${c}_run$i.json > $D/${c}_run$i.log 2>&1
  done
done
kill $VM
python3 $S --compare $(ls $D/a_run*.json | paste -sd,) $(ls $D/b_run*.json | paste -sd,) > $D/a_vs_b.txt
