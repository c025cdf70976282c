"""Summarises a campaign.sh directory: per round, the host's phase (the hand-off model's 16 KiB engine p50), tuned /
DeepSpeed per size for float32 auto, float32 cached and bf16 auto (p50 of the in-place tuned call / DeepSpeed's), and
the call budget's world-size-1 and fake-group figures.  python3 report.py DIR"""
import glob
import json
import re
import statistics
import sys
from collections import defaultdict

D = sys.argv[1]


def ratios(path):
    p = defaultdict(dict)
    for r in json.load(open(path))["results"]:
        if r["op"] == "all_reduce" and (r["inplace"] or r["backend"] == "deepspeed"):
            p[r["bytes"]][r["backend"]] = r["p50_us"]
    return {b: (v["tuned"] / v["deepspeed"], v["tuned"], v["deepspeed"]) for b, v in p.items()
            if "tuned" in v and "deepspeed" in v}


rounds = sorted({int(m.group(1)) for f in glob.glob(f"{D}/handoff_*.txt") if (m := re.search(r"_(\d+)\.txt$", f))})
table = defaultdict(lambda: defaultdict(list))
for i in rounds:
    phase = "?"
    for line in open(f"{D}/handoff_{i}.txt"):
        f = line.split()
        if len(f) > 4 and f[0] == "16384" and f[1] == "engine":
            phase = f"{float(f[3]):.1f} us"
    print(f"round {i}: hand-off model, 16 KiB one-shot p50 {phase} (fast phase ~2.6, slow ~11)")
    for tag in ("f32_auto", "f32_cached", "bf16_auto"):
        path = f"{D}/ar_{tag}_{i}.json"
        try:
            r = ratios(path)
        except (OSError, ValueError, KeyError):
            print(f"  {tag}: missing")
            continue
        print(f"  {tag:10s} tuned/DS " + "  ".join(f"{b >> 10}K {v[0]:.2f}" for b, v in sorted(r.items())))
        for b, v in r.items():
            table[tag][b].append(v)
print("\nmedian [min-max] of tuned / DeepSpeed over rounds (tuned, DeepSpeed median us)")
for tag, per in table.items():
    print(tag)
    for b, vs in sorted(per.items()):
        rs = [v[0] for v in vs]
        print(f"  {b:>9} {statistics.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]  "
              f"({statistics.median(v[1] for v in vs):.1f}, {statistics.median(v[2] for v in vs):.1f})")
