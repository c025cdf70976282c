"""tuned / DeepSpeed p50 (in place) per size over the runs given: median [min-max].
    python3 ratios.py ar_float32_*.json"""
import json
import statistics
import sys

rows = {}
for path in sys.argv[1:]:
    by = {}
    for r in json.load(open(path))["results"]:
        if r["op"] == "all_reduce" and r["inplace"]:
            by.setdefault(r["bytes"], {})[r["backend"]] = r["p50_us"]
    for size, v in by.items():
        if "tuned" in v and "deepspeed" in v:
            rows.setdefault(size, []).append(v["tuned"] / v["deepspeed"])
for size in sorted(rows):
    v = rows[size]
    print(f"{size:>9} {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}] over {len(v)} runs")
