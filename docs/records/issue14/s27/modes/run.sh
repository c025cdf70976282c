#!/bin/bash
# Session 27: K jobs of modes.py (auto / cached / streaming / 4 MiB slots / the stand-in at 64 MiB), each its own
# torchrun job (so each lands anew on the VM's host); load in times.log.   docs/records/issue14/s27/modes/run.sh DIR K
set -u
D=$1; K=${2:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p $D
export PYTHONPATH=$HERE/../../../../../python
log() { echo "$(date +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/times.log; }
for i in $(seq $K); do
  log "job $i"
  SETTINGS="auto,TUNEDIST_SLOT_STORES=cached,TUNEDIST_SLOT_STORES=streaming,TUNEDIST_SLOT_BYTES=4194304" \
    torchrun --standalone --nproc_per_node=2 $HERE/modes.py > $D/job_$i.log 2>&1
done
log "done"
