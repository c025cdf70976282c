"""Summarises a campaign.sh directory (session 19).  python3 report.py DIR
Per round: the host's phase (hand-off model, 16 KiB engine p50), tuned / DeepSpeed per size for float32 and bf16 two
ways (the bench's summary: median over its interleaved rounds of loop-mean ratios; and p50 over p50), the 64 MiB
busbw over 4(P-1)/(3P+1) x the memcpy probed beside each of its rounds, and the call budget. Then median [min-max]
over rounds, world size 4, and filing vs current."""
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict

D = sys.argv[1]


def load(path):
    with open(path) as f:
        return json.load(f)


def ar(path):
    d = load(path)
    rows = defaultdict(dict)
    for r in d["results"]:
        if r["op"] == "all_reduce" and (r["inplace"] or r["backend"] == "deepspeed"):
            rows[r["bytes"]][r["backend"]] = r
    summ = {s["bytes"]: s["ratio_median"] for s in d["summary"] if s["backend"] == "deepspeed"}
    out = {b: {"loop": 1 / summ[b], "p50": v["tuned"]["p50_us"] / v["deepspeed"]["p50_us"],
               "us": (v["tuned"]["time_us"], v["deepspeed"]["time_us"])}
           for b, v in rows.items() if b in summ and "tuned" in v and "deepspeed" in v}
    return out, d["bound"].get("beside_rounds", {})


def spread(xs):
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


rounds = sorted({int(m.group(1)) for f in glob.glob(f"{D}/handoff_*.txt") if (m := re.search(r"_(\d+)\.txt$", f))})
table = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
bound = defaultdict(list)
budget = defaultdict(lambda: defaultdict(list))
for i in rounds:
    phase = "?"
    for line in open(f"{D}/handoff_{i}.txt"):
        f = line.split()
        if len(f) > 4 and f[0] == "16384" and f[1] == "engine":
            phase = f"{float(f[3]):.1f} us"
    print(f"round {i}: hand-off model, 16 KiB one-shot p50 {phase} (fast phase ~2.6, slow ~11)")
    for d in ("float32", "bfloat16"):
        path = f"{D}/ar_{d}_{i}.json"
        if not os.path.exists(path):
            print(f"  {d}: missing")
            continue
        r, beside = ar(path)
        for how in ("loop", "p50"):
            print(f"  {d:8s} tuned/DS ({how:4s}) " + "  ".join(f"{b >> 10}K {v[how]:.2f}" for b, v in sorted(r.items())))
        for b, v in r.items():
            for how in ("loop", "p50"):
                table[d][how][b].append(v[how])
        for backend, x in beside.items():
            po = x["peers_only"]
            probes = "/".join(f"{m:.1f}" for m in x["memcpy_gbps_rounds"])
            busbw = "/".join(f"{m:.2f}" for m in x["busbw_gbps_rounds"])
            print(f"  {d:8s} 64M {backend:9s} busbw {busbw} GB/s, probes {probes} GB/s: / 4(P-1)/(3P+1) x probe "
                  f"{spread(po['ratio_rounds'])}")
            if backend == "tuned" and d == "float32":
                bound["ratio"] += po["ratio_rounds"]
                bound["probe"] += x["memcpy_gbps_rounds"]
    path = f"{D}/budget_{i}.json"
    if os.path.exists(path):
        for row in load(path)["rows"]:
            m = row["median_us"]
            vals = {"ws1/fake": m["tuned_ws1"] / m["fake"], "ws1 async/fake": m["tuned_ws1_async"] / m["fake"],
                    "tuned/DS": m["tuned"] / m["deepspeed"]}
            print(f"  budget {row['bytes'] >> 10}K " + "  ".join(f"{k} {v:.2f}" for k, v in vals.items()) +
                  "  | " + " ".join(f"{k} {v:.2f}" for k, v in row["budget_us"].items()))
            for k, v in vals.items():
                budget[row["bytes"]][k].append(v)
print("\nmedian [min-max] over rounds of tuned / DeepSpeed")
for d, hows in table.items():
    for how, per in hows.items():
        print(f"  {d:8s} {how:4s} " + "  ".join(f"{b >> 10}K {spread(v)}" for b, v in sorted(per.items())))
if bound:
    print(f"64 MiB float32 tuned busbw / (4(P-1)/(3P+1) x probe beside the round), all rounds: {spread(bound['ratio'])}"
          f"; probes {min(bound['probe']):.1f}-{max(bound['probe']):.1f} GB/s")
for b, per in sorted(budget.items()):
    print(f"budget {b >> 10}K " + "  ".join(f"{k} {spread(v)}" for k, v in per.items()))
if os.path.exists(f"{D}/ws4.json"):
    d = load(f"{D}/ws4.json")
    for s in d["summary"]:
        if s["backend"] != "tuned":
            print(f"ws4 {s['bytes'] >> 10}K tuned/{s['backend']} {1 / s['ratio_median']:.2f}")
if os.path.exists(f"{D}/filing_vs_current.txt"):
    print("\nfiling (A) vs current (B):")
    print(open(f"{D}/filing_vs_current.txt").read())
