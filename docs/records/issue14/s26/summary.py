"""What run.sh measured, per part, over its jobs (median [min-max] over jobs of each job's figure):
  settings  per (op, size): the job's median per-round ratio none / work (TUNEDIST_SYNC_WORK default / always).
  direct    s25/direct/summary.py over DIR/direct (tuned = dist.all_reduce, tuned-op = tunedist.all_reduce).
  budget    per size: dist.all_reduce on tuned over DeepSpeed's call, tuned_ws1 over the fake group.
    python3 docs/records/issue14/s26/summary.py DIR"""
import glob
import json
import statistics
import subprocess
import sys
from pathlib import Path

D = sys.argv[1]


def cell(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]" if values else "-"


ratios = {}
for path in sorted(glob.glob(f"{D}/settings/run_*.json")):
    for r in json.load(open(path))["results"]:
        ratios.setdefault((r["op"], r["bytes"]), []).append(r["settings"]["none"]["ratio_median"])
print(f"settings: none / work, {len(glob.glob(f'{D}/settings/run_*.json'))} jobs")
for (op, n), v in sorted(ratios.items()):
    print(f"  {op:>15} {n:>8}  {cell(v)}")
print("direct:")
subprocess.run([sys.executable, str(Path(__file__).parent.parent / "s25/direct/summary.py"), f"{D}/direct"], check=True)
budgets = [json.load(open(p)) for p in sorted(glob.glob(f"{D}/budget/budget_*.json"))]
print(f"budget: {len(budgets)} jobs; per job's medians")
for i, row in enumerate(budgets[0]["rows"]):
    n = row["bytes"]
    per = [b["rows"][i]["median_us"] for b in budgets]
    print(f"  {n:>8}  tuned / deepspeed {cell([m['tuned'] / m['deepspeed'] for m in per])}"
          f"  tuned_ws1 / fake {cell([m['tuned_ws1'] / m['fake'] for m in per])}"
          f"  tuned_ws1_async / fake {cell([m['tuned_ws1_async'] / m['fake'] for m in per])}"
          f"  tuned_async / tuned {cell([m['tuned_async'] / m['tuned'] for m in per])}"
          f"  tuned us {cell([m['tuned'] for m in per])}  deepspeed us {cell([m['deepspeed'] for m in per])}")
