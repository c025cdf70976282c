#!/usr/bin/env bash
# bench_hooks before/after: the same script (main's benchmarks/bench_hooks.py) against the baseline and new packages.
set -u
NEW=$1; RUNS=${2:-2}
cd /work/main
for run in $(seq "${START:-1}" "$RUNS"); do
  for pkg in baseline new; do
    dir=/tmp/baseline; [[ $pkg == new ]] && dir=$NEW
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "hooks run=$run pkg=$pkg load=$load $(date +%T)"
    PYTHONPATH=$dir timeout 900 python3 benchmarks/bench_hooks.py --part hook --iters 20 \
      --json /tmp/ab/hooks_${pkg}_run${run}.json > /tmp/ab/hooks_${pkg}_run${run}.log 2>&1 || echo "  FAILED rc=$?"
  done
done
