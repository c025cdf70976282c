#!/bin/bash
export DS_ACCELERATOR=cpu LOCAL_SIZE=2 PYTHONPATH=/work/s15/exp/python
for i in 1 2 3; do for v in 0 1; do
  echo "$(date +%T) demote=$v run$i load $(cut -d' ' -f1 /proc/loadavg)" >> times.log
  TUNEDIST_CLDEMOTE=$v torchrun --standalone --nproc_per_node=2 /work/main/benchmarks/bench_call_budget.py --sizes 4K,16K,64K,256K,1M --rounds 5 --no-gloo --json d${v}_$i.json > d${v}_$i.log 2>&1
done; done
