#!/bin/bash
# 3 runs each of float32 and bf16, ws2, tuned vs DeepSpeed, 4 KiB-1 MiB, final build of session 16
export DS_ACCELERATOR=cpu LOCAL_SIZE=2 PYTHONPATH=/work/main/python
for i in 1 2 3; do for dt in float32 bfloat16; do
  echo "$(date +%T) $dt run$i load $(cut -d' ' -f1-3 /proc/loadavg)" >> times.log
  torchrun --standalone --nproc_per_node=2 -m tunedist.bench --backends tuned,deepspeed --ops all_reduce -b 4K -e 1M -f 4 --rounds 3 -d $dt --no-progress --json ${dt}_run$i.json > ${dt}_run$i.txt 2>&1
done; done
