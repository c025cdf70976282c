"""Times all_gather_into_tensor (out of place and in place), reduce_scatter_tensor and broadcast through `dist`
only, so that two builds of tunedist (say, an issue's filing commit and today's) can be compared on one machine:

    PYTHONPATH=<build A>/python torchrun --standalone --nproc_per_node=2 benchmarks/bench_ab_builds.py --json a1.json
    PYTHONPATH=<build B>/python torchrun --standalone --nproc_per_node=2 benchmarks/bench_ab_builds.py --json b1.json
    ... alternating A B A B A B, then: python benchmarks/bench_ab_builds.py --compare a1.json,a2.json b1.json,b2.json

It uses nothing of tunedist but `import tunedist` and the `tuned` backend, so any build since the backend existed
runs it. Each point: warm-up, then `--rounds` timed loops; the figure is the median over rounds of each loop's p50
µs per call. Every point's result is checked against the closed form once, outside the timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
from bench_call_budget import parse_size, per_call_us  # this folder: the same size syntax and timing

DEFAULT_SIZES = "64K,256K,1M,4M,16M"


def make_points(nbytes: int, rank: int, world: int, empty=torch.empty, fresh: bool = False):
    """{name: (call, check)} for one size: `nbytes` is the all_gather output and the reduce_scatter input. `empty`
    allocates every buffer (tunedist.symmetric_empty with --symmetric). The in-place all_gather writes its input
    before every call, inside the timing; with `fresh`, every point does (as training does: the input was just
    computed, so it sits in its owner's cache), otherwise the others write theirs once."""
    n = nbytes // 4 // world * world
    block = n // world
    points = {}

    def point(name, write, collective, check):
        write()
        if fresh:
            points[name] = (lambda: (write(), collective()), check)
        else:
            points[name] = (collective, check)

    inp = empty(block)
    out = empty(n)
    expect_ag = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(block)
    point("all_gather oop", lambda: inp.fill_(float(rank + 1)), lambda: dist.all_gather_into_tensor(out, inp),
          lambda: torch.equal(out, expect_ag))
    buf = empty(n)
    mine = buf.narrow(0, rank * block, block)

    def ag_inplace():
        mine.fill_(float(rank + 1))
        dist.all_gather_into_tensor(buf, mine)

    points["all_gather ip"] = (ag_inplace, lambda: torch.equal(buf, expect_ag))
    rs_in = empty(n)
    rs_out = empty(block)
    total = float(world * (world + 1) // 2)
    point("reduce_scatter oop", lambda: rs_in.fill_(float(rank + 1)),
          lambda: dist.reduce_scatter_tensor(rs_out, rs_in), lambda: bool((rs_out == total).all()))
    bc = empty(n)
    bc.fill_(float(rank))  # a broadcast that moves nothing leaves the peers' values
    point("broadcast", lambda: bc.fill_(7.0) if rank == 0 else None, lambda: dist.broadcast(bc, src=0),
          lambda: bool((bc == 7.0).all()))
    return points


def measure(sizes, rounds: int, empty=torch.empty, fresh: bool = False) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict = {}
    for nbytes in sizes:
        iters = max(20, min(2000, (256 << 20) // nbytes // 4))
        for name, (call, check) in make_points(nbytes, rank, world, empty, fresh).items():
            for _ in range(5):
                call()
            ok = check()
            flags = torch.tensor([0 if ok else 1])
            dist.all_reduce(flags)
            assert flags.item() == 0, f"{name} {nbytes} B: wrong result on {flags.item()} rank(s)"
            per_round = []
            for _ in range(rounds):
                dist.barrier()
                t = torch.tensor([per_call_us(call, iters)], dtype=torch.float64)
                dist.all_reduce(t)
                per_round.append(t.item() / world)
            res[f"{name} {nbytes}"] = {"op": name, "bytes": nbytes, "p50_us": statistics.median(per_round),
                                       "rounds_us": per_round}
    return res


def compare(a_files: str, b_files: str) -> None:
    def load(files):
        acc: dict = {}
        for f in files.split(","):
            with open(f) as fh:
                for key, r in json.load(fh)["points"].items():
                    acc.setdefault(key, []).append(r["p50_us"])
        return acc

    a, b = load(a_files), load(b_files)
    print("# point: median over runs of p50 µs, A then B; A/B > 1 means B is faster; per-run A/B range")
    for key in a:
        if key in b:
            ma, mb = statistics.median(a[key]), statistics.median(b[key])
            pairs = [x / y for x, y in zip(a[key], b[key])]
            print(f"{key:32s} A {ma:10.1f}  B {mb:10.1f}  A/B {ma / mb:5.2f}  [{min(pairs):.2f}-{max(pairs):.2f}]")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--symmetric", action="store_true",
                   help="every buffer from the group's symmetric heap (tunedist.symmetric_empty; zero-copy from "
                        "TUNEDIST_SYMMETRIC_MIN_BYTES): builds that have it only")
    p.add_argument("--fresh", action="store_true",
                   help="every call first writes its input (the root's buffer for broadcast), timed: the input is "
                        "in its owner's cache, as in training, instead of wherever an earlier call left it")
    p.add_argument("--compare", nargs=2, metavar=("A_FILES", "B_FILES"),
                   help="comma-separated JSON files of build A and of build B: print the ratios, run nothing")
    args = p.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    import tunedist  # noqa: PLC0415  (--compare needs no build)

    torch.set_num_threads(1)
    dist.init_process_group("tuned")
    load0 = os.getloadavg()[0]
    empty = torch.empty
    if args.symmetric:
        empty = tunedist.symmetric_empty
    points = measure([parse_size(s) for s in args.sizes.split(",")], args.rounds, empty, args.fresh)
    if dist.get_rank() == 0:
        for key, r in points.items():
            print(f"{key:32s} {r['p50_us']:10.1f} us")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"tunedist_file": tunedist.__file__, "symmetric": args.symmetric, "fresh": args.fresh,
                           "world_size": dist.get_world_size(),
                           "load_before_after": [load0, os.getloadavg()[0]], "points": points}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
