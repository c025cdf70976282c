import json, glob, sys, re, statistics as st
from collections import defaultdict
d = sys.argv[1]; base = sys.argv[2] if len(sys.argv) > 2 else None
t = defaultdict(dict)  # (cfg) -> run -> {(op,bytes,inplace): p50}
for f in glob.glob(f"{d}/*.json"):
    m = re.match(r".*/(.+)_run(\d+)\.json", f); cfg, run = m.group(1), int(m.group(2))
    for r in json.load(open(f))["results"]:
        if r["backend"].startswith("tuned"):
            t[cfg].setdefault(run, {})[(r["op"], r["bytes"], r["inplace"])] = r["p50_us"]
cfgs = sorted(t); base = base or cfgs[0]
keys = sorted(next(iter(t[base].values())).keys())
print("op bytes inplace | " + " | ".join(f"{c} p50 med" for c in cfgs) + " | " + " | ".join(f"{base}/{c} med [range]" for c in cfgs if c != base))
for k in keys:
    meds = {c: st.median(v[k] for v in t[c].values() if k in v) for c in cfgs}
    row = f"{k[0]:>14} {k[1]:>9} {'ip ' if k[2] else 'oop'} | " + " | ".join(f"{meds[c]:8.1f}" for c in cfgs)
    for c in cfgs:
        if c == base: continue
        rs = [t[base][i][k] / t[c][i][k] for i in t[base] if i in t[c]]
        row += f" | {st.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]"
    print(row)
