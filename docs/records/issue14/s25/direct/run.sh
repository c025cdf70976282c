#!/bin/bash
# Session 25: tunedist.all_reduce (the operator, tuned-op) beside DeepSpeed's API (deepspeed), DeepSpeed's kernel
# called without its API (deepspeed-op) and dist.all_reduce on tuned (tuned), float32 SUM 4K-64M, K runs, each its own
# torchrun job (so each lands anew on the host); then one world-size-4 run. vmstat 5 throughout; load in times.log.
#   docs/records/issue14/s25/direct/run.sh DIR K
set -u
D=$1; K=${2:-3}
mkdir -p $D
CUR=$(cd "$(dirname "$0")/../../../../.." && pwd)
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
export DS_ACCELERATOR=cpu PYTHONPATH=$CUR/python
log() { echo "$(date +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  log "run $i"
  LOCAL_SIZE=2 torchrun --standalone --nproc_per_node=2 -m tunedist.bench \
    --backends tuned-op,deepspeed,deepspeed-op,tuned --ops all_reduce -d float32 -b 4K -e 64M -f 4 --rounds 3 \
    --no-progress --json $D/ar_$i.json > $D/ar_$i.log 2>&1
done
log "ws4"
LOCAL_SIZE=4 torchrun --standalone --nproc_per_node=4 -m tunedist.bench --backends tuned-op,deepspeed,deepspeed-op,tuned,gloo \
  --ops all_reduce -b 4K -e 16M -f 16 --rounds 3 --no-progress --json $D/ws4.json > $D/ws4.log 2>&1
log "done"
kill $VM
