"""The per-call cost of an on-completion hook (pg._register_on_completion_hook) on a small `tuned` all_reduce: one
group with no hook, one with a hook that records each WorkInfo, timed in alternating loops.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_completion_hook.py --json hook.json

Each round times one loop of back-to-back synchronous dist.all_reduce calls on each group (A B A B ...), after a
barrier and a few untimed calls; a loop's figure is its mean µs per call, and a row's figure the median over rounds,
with the spread (min-max over rounds). The ratio is hook / none per round (the two loops of a round ran back to
back), as its median and spread. The load average is printed beside the figures; run it on an idle machine.
To compare two builds with no hook (a build before hooks existed refuses the registration), run it with each build's
interpreter with --no-hook and a --label, alternating the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import tunedist  # noqa: F401  (a build from before the entry point needs the import to register "tuned")


def loop_us(t: torch.Tensor, group, iters: int) -> float:
    dist.barrier(group=group)
    for _ in range(5):
        dist.all_reduce(t, group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=4096, help="all_reduce size per rank (default 4096, float32)")
    p.add_argument("--iters", type=int, default=2000, help="calls per timed loop (default 2000)")
    p.add_argument("--rounds", type=int, default=15, help="alternating rounds (default 15)")
    p.add_argument("--label", default="", help="a name for this build in the output")
    p.add_argument("--no-hook", action="store_true", help="time the group without a hook only")
    p.add_argument("--json", help="write the results here (rank 0)")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("tuned", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    plain = dist.new_group(backend="tuned")
    hooked = dist.new_group(backend="tuned")
    seen = []
    if not args.no_hook:
        hooked._register_on_completion_hook(lambda info: seen.append(info.seq))
    t = torch.ones(args.bytes // 4)
    rows: dict[str, list[float]] = {"none": [], "hook": []}
    for _ in range(args.rounds):
        rows["none"].append(loop_us(t, plain, args.iters))
        if not args.no_hook:
            rows["hook"].append(loop_us(t, hooked, args.iters))
    ratios = [h / n for h, n in zip(rows["hook"], rows["none"])] or [float("nan")]
    if not args.no_hook:
        hooked._wait_for_pending_works()  # the hook runs on a thread of its own: count once it ran for every call
    load = os.getloadavg()
    dist.barrier()
    result = {
        "label": args.label, "bytes": args.bytes, "iters": args.iters, "rounds": args.rounds,
        "world_size": dist.get_world_size(), "loadavg": load,
        "none_us": {"median": statistics.median(rows["none"]), "min": min(rows["none"]), "max": max(rows["none"])},
        "hook_us": ({"median": statistics.median(rows["hook"]), "min": min(rows["hook"]), "max": max(rows["hook"])}
                    if rows["hook"] else None),
        "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "hook_calls_seen": len(seen),
    }
    if rank == 0:
        tag = f"[{args.label}] " if args.label else ""
        for row in ("none", "hook"):
            r = result[f"{row}_us"]
            if r is None:
                continue
            print(f"{tag}{row:5s} {r['median']:7.2f} us/call (rounds {r['min']:.2f}-{r['max']:.2f})")
        r = result["ratio"]
        print(f"{tag}hook/none {r['median']:.3f} (rounds {r['min']:.3f}-{r['max']:.3f}); "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; hook calls seen {len(seen)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
