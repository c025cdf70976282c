import json, statistics, sys
D = sys.argv[1]
a = [json.loads(l) for l in open(f"{D}/base.jsonl")]; b = [json.loads(l) for l in open(f"{D}/new.jsonl")]
print("# point: base p50 µs / new p50 µs, median over runs [range of per-pair ratios]; >1: new faster")
for k in a[0]:
    ra = [x[k] for x in a]; rb = [x[k] for x in b]; pr = sorted(x / y for x, y in zip(ra, rb))
    print(f"{k:22s} base {statistics.median(ra):9.1f} new {statistics.median(rb):9.1f}  ratio {statistics.median(pr):.2f} [{pr[0]:.2f}-{pr[-1]:.2f}]  n={len(pr)}")
