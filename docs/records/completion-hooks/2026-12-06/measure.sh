#!/usr/bin/env bash
# Alternating measurements: the build before completion hooks (7ea365e, venv t215base) against this branch (venv t215).
set -u
OUT=${1:?out dir}
ROUNDS=${2:-3}
mkdir -p "$OUT"
cd /work/wt-t215
export OMP_NUM_THREADS=1
for i in $(seq 1 "$ROUNDS"); do
  for b in t215base t215; do
    echo "$(date -u +%H:%M:%S) $b bench $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
    /work/venvs/$b/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 -m tunedist.bench \
      --backends tuned --ops all_reduce -b 4K -e 64K -f 4 --no-progress --json "$OUT/bench_${b}_$i.json" \
      > "$OUT/bench_${b}_$i.log" 2>&1
    echo "$(date -u +%H:%M:%S) $b nohook $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
    /work/venvs/$b/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \
      benchmarks/bench_completion_hook.py --no-hook --label "$b" --json "$OUT/nohook_${b}_$i.json" \
      > "$OUT/nohook_${b}_$i.log" 2>&1
  done
  echo "$(date -u +%H:%M:%S) t215 hook $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
  /work/venvs/t215/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \
    benchmarks/bench_completion_hook.py --label t215 --json "$OUT/hook_$i.json" > "$OUT/hook_$i.log" 2>&1
done
echo "$(date -u +%H:%M:%S) forms load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
/work/venvs/t215/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \
  benchmarks/bench_op_group_forms.py --json "$OUT/forms.json" > "$OUT/forms.log" 2>&1
echo "$(date -u +%H:%M:%S) done load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.log"
