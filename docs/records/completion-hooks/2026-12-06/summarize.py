"""Summarise the alternating runs: tunedist.bench all_reduce time per size (in place and out of place) for each build,
the ratio this branch / before per run pair, and the completion-hook figures."""
import json, glob, os, statistics, sys
out = sys.argv[1]
def bench(path):
    d = json.load(open(path))
    r = {}
    for row in d["results"]:
        if row["backend"] == "tuned" and row["op"] == "all_reduce":
            r[(row["bytes"], row["inplace"])] = row["time_us"]
    return r, d.get("load_avg_start"), d.get("load_avg_end")
runs = sorted({int(p.rsplit("_", 1)[1].split(".")[0]) for p in glob.glob(f"{out}/bench_t215_*.json")})
print("tunedist.bench, tuned all_reduce float32, world size 2, median of 3 interleaved rounds per job (us)")
keys = None
ratios = {}
for i in runs:
    a, la, _ = bench(f"{out}/bench_t215base_{i}.json")
    b, lb, _ = bench(f"{out}/bench_t215_{i}.json")
    keys = sorted(a)
    for k in keys:
        ratios.setdefault(k, []).append(b[k] / a[k])
        print(f"run {i} {k[0]:>6} B {'in ' if k[1] else 'out'}-place  before {a[k]:7.2f}  after {b[k]:7.2f}  ratio {b[k]/a[k]:.3f}  load {la} / {lb}")
print("ratio after/before, median (min-max) over runs:")
for k in keys:
    v = ratios[k]
    print(f"  {k[0]:>6} B {'in ' if k[1] else 'out'}-place  {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
allr = [x for v in ratios.values() for x in v]
print(f"  all sizes: median {statistics.median(allr):.3f}, min {min(allr):.3f}, max {max(allr):.3f}")
print()
print("bench_completion_hook.py --no-hook, 4 KiB, us/call (median over 15 rounds, spread):")
nh = {}
for i in runs:
    for b in ("t215base", "t215"):
        d = json.load(open(f"{out}/nohook_{b}_{i}.json"))
        nh.setdefault(b, []).append(d["none_us"]["median"])
        print(f"  run {i} {b:9s} {d['none_us']['median']:7.2f} ({d['none_us']['min']:.2f}-{d['none_us']['max']:.2f}) load {d['loadavg'][0]:.2f}")
r = [b / a for a, b in zip(nh["t215base"], nh["t215"])]
print(f"  ratio after/before per run: {', '.join(f'{x:.3f}' for x in r)}")
print()
print("bench_completion_hook.py (this branch), 4 KiB, us/call:")
for i in runs:
    d = json.load(open(f"{out}/hook_{i}.json"))
    print(f"  run {i} none {d['none_us']['median']:.2f} ({d['none_us']['min']:.2f}-{d['none_us']['max']:.2f})  hook {d['hook_us']['median']:.2f} ({d['hook_us']['min']:.2f}-{d['hook_us']['max']:.2f})  hook/none {d['ratio']['median']:.3f} ({d['ratio']['min']:.3f}-{d['ratio']['max']:.3f}) load {d['loadavg'][0]:.2f} seen {d['hook_calls_seen']}")
if os.path.exists(f"{out}/forms.json"):
    d = json.load(open(f"{out}/forms.json"))
    print()
    print(f"bench_op_group_forms.py, {d['bytes']} B, us/call (median over {d['rounds']} rounds, spread), load {d['load']}:")
    for k, v in d["us"].items():
        print(f"  {k:24s} {v['median']:7.2f} ({v['min']:.2f}-{v['max']:.2f})")
