#!/bin/bash
# Session 19: the figures of issue 14 with this build, K rounds in one sitting. Per round: the hand-off model's
# 16 KiB figure (which phase the host is in), all_reduce float32 and bf16 4K-64M with tuned and DeepSpeed in one job
# (the bench now probes memcpy, synchronised, beside every round of the 64 MiB point), the call budget (fake group,
# world size 1, tuned, DeepSpeed), and the filing build (09f0ce0) vs this one for all_gather / reduce_scatter /
# broadcast (bench_ab_builds.py, inputs written once), alternating which goes first. After the rounds, one world-size-4
# run with gloo and DeepSpeed. vmstat 5 runs throughout (load, steal).
#   docs/records/issue14/s19/campaign.sh DIR K FILING_PYTHONPATH HANDOFF_BINARY
set -u
D=$1; K=${2:-3}; FILING=$3; HANDOFF=$4
mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
export DS_ACCELERATOR=cpu LOCAL_SIZE=2
CUR=$(cd "$(dirname "$0")/../../../.." && pwd)
B="torchrun --standalone --nproc_per_node=2"
log() { echo "$(date +%T) $* load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  log "round $i handoff"; $HANDOFF 3 > $D/handoff_$i.txt 2>&1
  for d in float32 bfloat16; do
    log "round $i all_reduce $d"
    PYTHONPATH=$CUR/python $B -m tunedist.bench --backends tuned,deepspeed --ops all_reduce -d $d \
      -b 4K -e 64M -f 4 --rounds 3 --no-progress --json $D/ar_${d}_$i.json > $D/ar_${d}_$i.log 2>&1
  done
  log "round $i budget"
  PYTHONPATH=$CUR/python $B $CUR/benchmarks/bench_call_budget.py --sizes 4K,16K,64K --rounds 3 --no-gloo \
    --json $D/budget_$i.json > $D/budget_$i.log 2>&1
  if [ $((i % 2)) = 1 ]; then ORD="filing current"; else ORD="current filing"; fi
  for b in $ORD; do
    pp=$FILING; [ $b = current ] && pp=$CUR/python
    log "round $i ab $b"
    PYTHONPATH=$pp $B $CUR/benchmarks/bench_ab_builds.py --json $D/ab_${b}_$i.json > $D/ab_${b}_$i.log 2>&1
  done
done
log "ws4"
LOCAL_SIZE=4 PYTHONPATH=$CUR/python torchrun --standalone --nproc_per_node=4 -m tunedist.bench \
  --backends tuned,gloo,deepspeed --ops all_reduce -b 4K -e 16M -f 16 --rounds 3 --no-progress \
  --json $D/ws4.json > $D/ws4.log 2>&1
log "done"
kill $VM
python3 $CUR/benchmarks/bench_ab_builds.py --compare $(ls $D/ab_filing_*.json | paste -sd,) \
  $(ls $D/ab_current_*.json | paste -sd,) > $D/filing_vs_current.txt
