"""async+wait / sync per run and size, for each policy: python3 sched_report.py DIR"""
import glob, json, statistics, sys
d = sys.argv[1]
for v in ("normal", "batch"):
    rows = {}
    for f in sorted(glob.glob(f"{d}/{v}_*.json")):
        for r in json.load(open(f))["rows"]:
            m = r["median_us"]
            rows.setdefault(r["bytes"], []).append((m["tuned"], m["tuned_async"]))
    for b, xs in sorted(rows.items()):
        ratios = [a / s for s, a in xs]
        print(f"{v:>6} {b:>6} sync {statistics.median(s for s, _ in xs):6.2f} async {statistics.median(a for _, a in xs):6.2f}"
              f"  async/sync per run " + " ".join(f"{x:.2f}" for x in ratios))
