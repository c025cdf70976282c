#!/usr/bin/env bash
# Before/after of the #12 restructure: baseline package (62781f8) vs new, interleaved run by run.
# usage: run.sh <new-pkg-dir> <runs> <ws list>
set -u
NEW=$1; RUNS=${2:-3}; WSS=${3:-"2 4"}
cd /tmp/ab
for ws in $WSS; do
  for run in $(seq 1 "$RUNS"); do
    for pkg in baseline new; do
      dir=/tmp/baseline; [[ $pkg == new ]] && dir=$NEW
      load=$(cut -d' ' -f1 /proc/loadavg)
      echo "ws=$ws run=$run pkg=$pkg load=$load $(date +%T)"
      PYTHONPATH=$dir timeout 900 python3 -m torch.distributed.run --standalone --nproc_per_node=$ws -m tunedist.bench \
        --backends tuned,gloo --ops all_reduce,all_gather,reduce_scatter,broadcast -b 8 -e 16M -f 8 --no-progress \
        --json /tmp/ab/ws${ws}_${pkg}_run${run}.json > /tmp/ab/ws${ws}_${pkg}_run${run}.log 2>&1 || echo "  FAILED rc=$?"
      echo "$load" > /tmp/ab/ws${ws}_${pkg}_run${run}.load
    done
  done
done
