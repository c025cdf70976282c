"""Per job of s25/direct/run.sh (run with the all_reduce stand-in in tunedist.bench, session 27), at the bound point
(the largest all_reduce): each contender's busbw over the peers-only formula x the memcpy probe, and the stand-in's
time over the contender's (> 1: faster than the design runs on the job's CPUs), median [min-max] over the job's
rounds; then the s25 ratio table.
    python3 docs/records/issue14/s27/standin_summary.py DIR"""
import glob
import json
import statistics
import subprocess
import sys
from pathlib import Path

D = sys.argv[1]


def cell(v):
    return f"{v['ratio_median']:.2f} [{v['ratio_min']:.2f}-{v['ratio_max']:.2f}]"


per = {}
for path in sorted(glob.glob(f"{D}/ar_*.json")) + sorted(glob.glob(f"{D}/ws4.json")):
    run = json.load(open(path))
    beside = run["bound"]["beside_rounds"]
    any_b = next(iter(beside.values()))
    us = "/".join(f"{s['best']:.0f}" for s in any_b["standin"]["standin_us_rounds"])
    mem = "/".join(f"{m:.1f}" for m in any_b["memcpy_gbps_rounds"])
    print(f"{Path(path).name} P={run['world_size']} at {any_b['bytes']} B: stand-in {us} us, memcpy {mem} GB/s, "
          f"load {run['load_avg_start'][0]:.2f}->{run['load_avg_end'][0]:.2f}")
    for backend, b in beside.items():
        print(f"   {backend:>13}  formula {cell(b['peers_only'])}  stand-in / it {cell(b['standin'])}")
        if run["world_size"] == 2:
            per.setdefault(backend, []).append(b["standin"]["ratio_median"])
print("world size 2, over jobs (each job's median over its rounds): stand-in time / contender's time")
for backend, v in per.items():
    print(f"   {backend:>13}  {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]  ({len(v)} jobs)")
subprocess.run([sys.executable, str(Path(__file__).parent.parent / "s25/direct/summary.py"), D], check=True)
