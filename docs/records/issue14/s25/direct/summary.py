"""Ratios of the runs of run.sh: each contender's in-place all_reduce time over tuned-op's in the same run (the bench's
time: median over its 3 interleaved rounds of the loop's mean), then the median [min-max] over runs.
    python3 docs/records/issue14/s25/direct/summary.py DIR"""
import glob
import json
import statistics
import sys

runs = [json.load(open(p)) for p in sorted(glob.glob(f"{sys.argv[1]}/ar_*.json"))]
pairs = [("deepspeed", "tuned-op"), ("deepspeed-op", "tuned-op"), ("tuned", "tuned-op"), ("tuned", "deepspeed")]
sizes = sorted({r["bytes"] for run in runs for r in run["results"]})
times = {}
for k, run in enumerate(runs):
    for r in run["results"]:
        if r["inplace"] and r["time_us"]:
            times[(k, r["backend"], r["bytes"])] = r["time_us"]
print(f"{len(runs)} runs; ratio = A time / B time in the same run, median [min-max] over runs (> 1: B faster)")
print(f"{'size':>9} " + " ".join(f"{a + ' / ' + b:>30}" for a, b in pairs) + "   tuned-op us (median)")
for n in sizes:
    cells = []
    for a, b in pairs:
        rs = [times[(k, a, n)] / times[(k, b, n)] for k in range(len(runs)) if (k, a, n) in times and (k, b, n) in times]
        cells.append(f"{statistics.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]" if rs else "-")
    op = [times[(k, "tuned-op", n)] for k in range(len(runs)) if (k, "tuned-op", n) in times]
    print(f"{n:>9} " + " ".join(f"{c:>30}" for c in cells) + f"   {statistics.median(op):.2f}")
