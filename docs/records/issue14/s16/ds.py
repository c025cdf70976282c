import json, sys, glob, statistics as st
from collections import defaultdict
rat = defaultdict(list)
for f in sorted(sys.argv[1:]):
    d = json.load(open(f)); p = defaultdict(dict)
    for r in d["results"]:
        if r["op"] == "all_reduce" and (r["inplace"] or r["backend"] == "deepspeed"):
            p[(r["dtype"], r["bytes"])][r["backend"]] = r["p50_us"]
    for k, v in sorted(p.items()):
        if "tuned" in v and "deepspeed" in v:
            rat[k].append((v["tuned"] / v["deepspeed"], v["tuned"], v["deepspeed"], v.get("gloo")))
for k, v in sorted(rat.items()):
    print(f"{k[0]:>9} {k[1]:>9}  tuned/DS " + " ".join(f"{x[0]:.2f}" for x in v) + "   (tuned,DS µs: " + "; ".join(f"{x[1]:.1f},{x[2]:.1f}" for x in v) + ")")
