#!/bin/bash
# Session 23: the filing build (09f0ce0) against this one for all_gather / reduce_scatter / broadcast, each point
# with its floor beside it (bench_ab_builds.py --floor), K rounds alternating which build goes first; then --compare.
# With a fourth argument "symmetric", this build's buffers come from the symmetric heap (zero-copy).
#   docs/records/issue14/s23/floor.sh DIR K FILING_PYTHONPATH [symmetric]
set -u
D=$1; K=${2:-3}; FILING=$3; SYM=${4:-}
mkdir -p $D
vmstat 5 > $D/vmstat.log 2>&1 & VM=$!
CUR=$(cd "$(dirname "$0")/../../../.." && pwd)
B="torchrun --standalone --nproc_per_node=2"
log() { echo "$(date +%T) $* load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  if [ $((i % 2)) = 1 ]; then ORD="filing current"; else ORD="current filing"; fi
  for b in $ORD; do
    pp=$FILING; [ $b = current ] && pp=$CUR/python
    log "round $i $b"
    extra=""; [ $b = current ] && [ "$SYM" = symmetric ] && extra=--symmetric
    PYTHONPATH=$pp $B $CUR/benchmarks/bench_ab_builds.py --floor $extra --json $D/ab_${b}_$i.json > $D/ab_${b}_$i.log 2>&1
  done
done
log "done"
kill $VM
python3 $CUR/benchmarks/bench_ab_builds.py --compare $(ls $D/ab_filing_*.json | paste -sd,) \
  $(ls $D/ab_current_*.json | paste -sd,) > $D/filing_vs_current.txt
