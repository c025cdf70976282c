"""Summarise several jobs of `python -m tunedist.bench --backends tuned-op,deepspeed,deepspeed-op,tuned --ops
all_reduce --json DIR/ar_<k>.json` (each job its own torchrun, so each lands anew on the host's CPUs):

- per size, the time of one contender over another's in the same job (the bench's time: median over its interleaved
  rounds of the loop's mean, in-place calls), then the median [min-max] over jobs;
- at the bound point (the largest all_reduce), each contender's busbw over 4(P-1)/(3P+1) x the memcpy probe, and the
  all_reduce stand-in's time over the contender's (> 1: faster than the design runs on the job's CPUs).

    python benchmarks/allreduce_ratios.py DIR
"""

from __future__ import annotations

import glob
import json
import statistics
import sys

PAIRS = [("tuned", "deepspeed"), ("deepspeed", "tuned-op"), ("deepspeed-op", "tuned-op"), ("tuned", "tuned-op")]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(directory: str) -> int:
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{directory}/ar_*.json"))]
    if not runs:
        print(f"no ar_*.json in {directory}", file=sys.stderr)
        return 1
    times = {}
    for k, run in enumerate(runs):
        for r in run["results"]:
            if r["inplace"] and r["time_us"]:
                times[(k, r["backend"], r["bytes"])] = r["time_us"]
    sizes = sorted({n for _, _, n in times})
    print(f"{len(runs)} jobs; A / B = A's time over B's in the same job, median [min-max] over jobs (> 1: B faster)")
    print(f"{'bytes':>10} " + " ".join(f"{a + ' / ' + b:>28}" for a, b in PAIRS) + "   tuned-op us")
    for n in sizes:
        cells = []
        for a, b in PAIRS:
            rs = [times[(k, a, n)] / times[(k, b, n)] for k in range(len(runs))
                  if (k, a, n) in times and (k, b, n) in times]
            cells.append(spread(rs) if rs else "-")
        op = [times[(k, "tuned-op", n)] for k in range(len(runs)) if (k, "tuned-op", n) in times]
        print(f"{n:>10} " + " ".join(f"{c:>28}" for c in cells) + (f"   {statistics.median(op):.2f}" if op else ""))
    per_backend: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        for backend, b in run.get("bound", {}).get("beside_rounds", {}).items():
            if "standin" in b and "peers_only" in b:
                per_backend.setdefault(backend, []).append(
                    (b["peers_only"]["ratio_median"], b["standin"]["ratio_median"]))
    if per_backend:
        print("at the bound point, per job's median over its rounds, then median [min-max] over jobs:")
        for backend, v in per_backend.items():
            print(f"{backend:>14}  busbw / (4(P-1)/(3P+1) x memcpy) {spread([f for f, _ in v])}"
                  f"   stand-in time / its time {spread([s for _, s in v])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
