#!/bin/bash
# Session 20: the build before RoundStoreChooser (bd1b3d5) against this one, alternating which goes first, K rounds.
# Per build and round: all_reduce float32 16K-1M with tuned and DeepSpeed in one job (tunedist.bench), and
# bench_ab_builds.py (all_gather out of place / in place, reduce_scatter, broadcast) at 16K-1M. vmstat 5 throughout.
#   docs/records/issue14/s20/ab_round_stores.sh DIR K BEFORE_PYTHONPATH
set -u
D=$1; K=${2:-3}; BEFORE=$3
mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
export DS_ACCELERATOR=cpu LOCAL_SIZE=2
CUR=$(cd "$(dirname "$0")/../../../.." && pwd)
B="torchrun --standalone --nproc_per_node=2"
log() { echo "$(date +%T) $* load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  if [ $((i % 2)) = 1 ]; then ORD="before now"; else ORD="now before"; fi
  for b in $ORD; do
    pp=$BEFORE; [ $b = now ] && pp=$CUR/python
    log "round $i all_reduce $b"
    PYTHONPATH=$pp $B -m tunedist.bench --backends tuned,deepspeed --ops all_reduce -b 16K -e 1M -f 2 --rounds 3 \
      --no-progress --json $D/ar_${b}_$i.json > $D/ar_${b}_$i.log 2>&1
    log "round $i ab $b"
    PYTHONPATH=$pp $B $CUR/benchmarks/bench_ab_builds.py --sizes 16K,32K,64K,128K,256K,1M \
      --json $D/ab_${b}_$i.json > $D/ab_${b}_$i.log 2>&1
  done
done
log "done"
kill $VM
python3 $CUR/benchmarks/bench_ab_builds.py --compare $(ls $D/ab_before_*.json | paste -sd,) \
  $(ls $D/ab_now_*.json | paste -sd,) > $D/before_vs_now.txt
