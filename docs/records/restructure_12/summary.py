"""Median over runs of tuned time (after/before) and tuned/gloo speedup per op and size."""
import glob, json, statistics, sys
from collections import defaultdict
ws_list = sys.argv[1:] or ["2", "4"]
for ws in ws_list:
    t = defaultdict(list)  # (pkg, backend, op, bytes) -> [time]
    loads = defaultdict(list)
    for f in sorted(glob.glob(f"/tmp/ab/ws{ws}_*_run*.json")):
        pkg = f.split("_")[1]
        try:
            d = json.load(open(f))
        except Exception:
            continue
        try:
            loads[pkg].append(float(open(f.replace(".json", ".load")).read()))
        except Exception:
            pass
        has_out_of_place = {r["op"] for r in d["results"] if not r["inplace"]}
        for r in d["results"]:
            if r["inplace"] and r["op"] in has_out_of_place:
                continue
            assert r["wrong"] == 0, (f, r)
            t[(pkg, r["backend"], r["op"], r["bytes"])].append(r["time_us"])
    print(f"\n## world size {ws}  (runs: baseline {len(loads['baseline'])}, new {len(loads['new'])}; load 1-min "
          f"baseline {loads['baseline']}, new {loads['new']})")
    print("| op | bytes | tuned before µs | tuned after µs | after/before (min-max over runs) | gloo/tuned before | gloo/tuned after |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(k[2], k[3]) for k in t})
    ratios_all = []
    for op, b in keys:
        tb = t[("baseline", "tuned", op, b)]; ta = t[("new", "tuned", op, b)]
        gb = t[("baseline", "gloo", op, b)]; ga = t[("new", "gloo", op, b)]
        if not tb or not ta:
            continue
        per_run = [a / bb for a, bb in zip(ta, tb)]
        ratios_all.append(statistics.median(ta) / statistics.median(tb))
        print(f"| {op} | {b} | {statistics.median(tb):.1f} | {statistics.median(ta):.1f} | "
              f"{statistics.median(ta)/statistics.median(tb):.2f} ({min(per_run):.2f}-{max(per_run):.2f}) | "
              f"{statistics.median(gb)/statistics.median(tb):.1f} | {statistics.median(ga)/statistics.median(ta):.1f} |")
    if ratios_all:
        print(f"geometric-ish: median after/before over all points {statistics.median(ratios_all):.3f}, "
              f"min {min(ratios_all):.2f}, max {max(ratios_all):.2f}")
