#!/bin/bash
# Session 24: the round chooser (whole-operation cost) for multi-round operations, against the per-copy chooser they
# had (TUNEDIST_SLOT_STORES=per-copy) and both forced modes, K separate jobs (each job lands on the VM's cores anew).
#   docs/records/issue14/s24/stores/run.sh DIR K
set -u
D=$1; K=${2:-3}
mkdir -p $D
CUR=$(cd "$(dirname "$0")/../../../../.." && pwd)
S="--setting auto: --setting percopy:TUNEDIST_SLOT_STORES=per-copy --setting cached:TUNEDIST_SLOT_STORES=cached"
S="$S --setting streaming:TUNEDIST_SLOT_STORES=streaming"
for j in $(seq $K); do
  echo "$(date +%T) job $j load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
  PYTHONPATH=$CUR/python torchrun --standalone --nproc_per_node=2 $CUR/benchmarks/bench_settings.py \
    --ops all_reduce --sizes 1M,4M,16M,64M --rounds 7 $S > $D/ar_$j.txt 2>&1
  PYTHONPATH=$CUR/python torchrun --standalone --nproc_per_node=2 $CUR/benchmarks/bench_settings.py \
    --ops all_gather,reduce_scatter,broadcast --sizes 4M,16M --rounds 7 $S > $D/ag_rs_bc_$j.txt 2>&1
  if [ "${MORE:-1}" = 1 ]; then  # the other collectives (session 24's second change; unset MORE=0 for the first runs)
    PYTHONPATH=$CUR/python torchrun --standalone --nproc_per_node=2 $CUR/benchmarks/bench_settings.py \
      --ops all_to_all,reduce,gather,scatter --sizes 4M,16M --rounds 7 $S > $D/more_$j.txt 2>&1
  fi
done
echo "$(date +%T) done load $(cut -d' ' -f1 /proc/loadavg)" >> $D/times.log
