#!/bin/bash
# Session 25: dist.all_reduce on tuned, the session's start build (36222a6, installed in site-packages by the CI clone)
# against this one (PYTHONPATH=<repo>/python), each beside DeepSpeed's API in its own job, alternating which goes
# first, K pairs. Did the runNow/allreduceArgs changes slow the dist path?  run.sh DIR K
set -u
D=$1; K=${2:-4}; mkdir -p $D
CUR=$(cd "$(dirname "$0")/../../../../.." && pwd)
export DS_ACCELERATOR=cpu LOCAL_SIZE=2
one() { if [ $1 = new ]; then P=$CUR/python; else P=; fi
  PYTHONPATH=$P torchrun --standalone --nproc_per_node=2 -m tunedist.bench --backends tuned,deepspeed --ops all_reduce \
    -b 4K -e 1M -f 4 --rounds 5 --no-progress --json $D/$1_$2.json > $D/$1_$2.log 2>&1
  echo "$(date +%T) $1 $2 load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  if [ $((i % 2)) = 1 ]; then one old $i; one new $i; else one new $i; one old $i; fi
done
