#!/bin/bash
# Session 26: synchronous calls that run inline return no Work (TUNEDIST_SYNC_WORK). Three parts, in one sitting:
#   1. K jobs of bench_settings.py: the same build with a Work for every call (always) and without (the default),
#      each its own tuned group, taking turns size by size; all_reduce, all_gather, reduce_scatter, broadcast.
#   2. s25/direct/run.sh DIR/direct K: tunedist.all_reduce, DeepSpeed's API and bare kernel, dist.all_reduce on tuned.
#   3. K jobs of bench_call_budget.py at 4K/16K/64K.
#   docs/records/issue14/s26/run.sh DIR K
set -u
D=$1; K=${2:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
CUR=$(cd "$HERE/../../../.." && pwd)
mkdir -p $D/settings $D/budget
export DS_ACCELERATOR=cpu LOCAL_SIZE=2 PYTHONPATH=$CUR/python
log() { echo "$(date +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/times.log; }
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
for i in $(seq $K); do
  log "settings $i"
  torchrun --standalone --nproc_per_node=2 $CUR/benchmarks/bench_settings.py \
    --setting work:TUNEDIST_SYNC_WORK=always --setting none: --ops all_reduce,all_gather,reduce_scatter,broadcast \
    --sizes 4K,16K,64K,256K,1M --rounds 5 --json $D/settings/run_$i.json > $D/settings/run_$i.log 2>&1
done
kill $VM
log "direct"
$CUR/docs/records/issue14/s25/direct/run.sh $D/direct $K
for i in $(seq $K); do
  log "budget $i"
  torchrun --standalone --nproc_per_node=2 $CUR/benchmarks/bench_call_budget.py --sizes 4K,16K,64K --rounds 5 \
    --no-gloo --json $D/budget/budget_$i.json > $D/budget/budget_$i.log 2>&1
done
log "done"
