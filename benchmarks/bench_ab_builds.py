"""Times all_gather_into_tensor (out of place and in place), reduce_scatter_tensor and broadcast through `dist`
only, so that two builds of tunedist (a baseline build, A, and the other build, B) can be compared on one machine:

    PYTHONPATH=<build A>/python torchrun --standalone --nproc_per_node=2 benchmarks/bench_ab_builds.py --json a1.json
    PYTHONPATH=<build B>/python torchrun --standalone --nproc_per_node=2 benchmarks/bench_ab_builds.py --json b1.json
    ... alternating A B A B A B, then: python benchmarks/bench_ab_builds.py --compare a1.json,a2.json b1.json,b2.json

It uses nothing of tunedist but `import tunedist` and the `tuned` backend, so any build since the backend existed
runs it; what it shares with the other tools comes from benchmarks/_common.py, which needs torch only. Each point:
warm-up, then `--rounds` timed loops; the figure is the median over rounds of each loop's p50 µs per call. Every
point's result is checked against the closed form once, outside the timing.

With --floor every point also gets a floor, timed in the same rounds beside it: the bytes that any design of the
operation must move on a rank, moved by a plain local copy or reduction (no collective, no synchronisation, every
rank at once so they share the memory bus as in the operation), the slowest rank's time. Data a rank takes from a
peer crosses cores in any design, which a local copy does not: so the floor is below what any all_gather,
reduce_scatter or broadcast can reach here, zero-copy ones included, as far as the stand-in is the fastest way to
move those bytes: it touches no more memory than its operation (so it finds its sources in the caches at least as
often), and each copy is timed both with torch's copy and with the engine's streaming one, the faster counting. A
point whose operation beats its floor (B/F < 1) is flagged: that floor is no floor. Give --floor to both builds'
runs, so that both time their points the same way. `--compare` prints, per point, build B's floor and whether "2x
faster than build A" (A/2) lies under it, that is, would need the bytes moved faster than the fastest local copy
measured beside it (decided only for floors of at least VERDICT_MIN_FLOOR_US: each stand-in call adds 1-3 µs):

    all_gather out of place   each of the P blocks of out (S bytes) <- the input   (P ranks, S the output bytes)
    all_gather in place       own block written (the bench's fill), then copied into the P - 1 other blocks
    reduce_scatter            out (S/P) <- sum of the P blocks of a local S-byte input, one pass
    broadcast                 every non-root rank copies S bytes; the root moves nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.distributed as dist
from _common import load_avg, over_ranks, parse_sizes, per_call_us, process_group, ranks_failing, run_meta, write_json

DEFAULT_SIZES = "64K,256K,1M,4M,16M"
# A floor includes its stand-ins' own call overhead (a torch op or a pybind call: 1-3 µs each), which no design
# needs: only a floor this large (overhead a few percent of it) decides that 2x lies under it.
VERDICT_MIN_FLOOR_US = 100.0


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


def _copiers() -> list:
    """Ways to copy src into dst for the floors: torch's copy (cached stores) and, where the build has it, the
    engine's (streaming stores, tunedist._C.copy_gbps), which is the faster one for copies larger than the caches."""
    import tunedist  # noqa: PLC0415

    copiers = [lambda dst, src: dst.copy_(src)]
    engine = getattr(tunedist._C, "copy_gbps", None)
    if engine is not None:
        copiers.append(lambda dst, src: engine(dst, src) if dst.numel() else None)
    return copiers


def make_floors(nbytes: int, rank: int, world: int) -> dict:
    """{"floor <op>": [(call, check), ...]}: the local stand-ins of make_points' operations (see the module
    docstring), one per way of copying; a floor takes the fastest. Each stand-in touches no more memory than its
    operation, so that it finds its source in the caches at least as often: the all_gathers copy this rank's own
    block into every other one (its source read P - 1 times, as the peers' blocks are in a zero-copy design)."""
    n = nbytes // 4 // world * world
    block = n // world
    floors: dict = {}
    inp = torch.full((block,), float(rank + 1))
    out = torch.empty(n)
    out_blocks = list(out.split(block))
    # The in-place output's blocks as tensors of their own (the same bytes), so the engine's copy takes them too.
    mine = torch.empty(block)
    others = [torch.empty(block) for _ in range(world - 1)]
    expect_block = torch.full((block,), float(rank + 1))
    expect = torch.full((n,), float(rank + 1))
    src = torch.full((n,), float(rank + 2))
    bc = torch.empty(n)
    for copy in _copiers():
        def ag_outofplace(copy=copy):
            for b in out_blocks:
                copy(b, inp)

        def ag_inplace(copy=copy):
            mine.fill_(float(rank + 1))
            for b in others:
                copy(b, mine)

        floors.setdefault("floor all_gather oop", []).append((ag_outofplace, lambda: torch.equal(out, expect)))
        floors.setdefault("floor all_gather ip", []).append(
            (ag_inplace, lambda: all(torch.equal(b, expect_block) for b in [mine, *others])))
        reader = (lambda copy=copy: copy(bc, src), lambda: torch.equal(bc, src))
        floors.setdefault("floor broadcast", []).append((lambda: None, lambda: True) if rank == 0 else reader)
    rs_in = torch.full((world, block), float(rank + 1))
    rs_out = torch.empty(block)
    rs_ok = lambda: bool((rs_out == float(world * (rank + 1))).all())  # noqa: E731
    floors["floor reduce_scatter oop"] = [(lambda: torch.sum(rs_in, dim=0, out=rs_out), rs_ok)]
    if world == 2:
        floors["floor reduce_scatter oop"].append((lambda: torch.add(rs_in[0], rs_in[1], out=rs_out), rs_ok))
    return floors


def _timed_round(call, iters: int, reduce_op) -> float:
    """A barrier, then each rank's median µs per call over `iters`, combined over ranks by `reduce_op` (SUM, divided
    by the world size: the mean; or MAX: the slowest rank)."""
    dist.barrier()
    return over_ranks([per_call_us(call, iters)], reduce_op, mean=reduce_op == dist.ReduceOp.SUM)[0]


def _check(key: str, nbytes: int, call, check) -> None:
    """Warm-up, then the result on every rank against its closed form (a wrong one fails the run)."""
    for _ in range(5):
        call()
    failing = ranks_failing(check())
    assert failing == 0, f"{key} {nbytes} B: wrong result on {failing} rank(s)"


def measure(sizes, rounds: int, empty=torch.empty, fresh: bool = False, floor: bool = False) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict = {}
    for nbytes in sizes:
        iters = max(20, min(2000, (256 << 20) // nbytes // 4))
        points = make_points(nbytes, rank, world, empty, fresh)
        floors = make_floors(nbytes, rank, world) if floor else {}
        for name, (call, check) in points.items():
            _check(name, nbytes, call, check)
            variants = floors.get(f"floor {name}", [])
            for c, chk in variants:
                _check(f"floor {name}", nbytes, c, chk)
            times: dict = {name: []}
            # The floor's rounds alternate with the operation's, so the two see the same phase of the host; each
            # round's floor is its fastest variant there, timed on the slowest rank.
            for _ in range(rounds):
                times[name].append(_timed_round(call, iters, dist.ReduceOp.SUM))
                if variants:
                    times.setdefault(f"floor {name}", []).append(
                        min(_timed_round(c, iters, dist.ReduceOp.MAX) for c, _ in variants))
            for key, t in times.items():
                res[f"{key} {nbytes}"] = {"op": key, "bytes": nbytes, "p50_us": statistics.median(t), "rounds_us": t}
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
        if key in b and not key.startswith("floor "):
            ma, mb = statistics.median(a[key]), statistics.median(b[key])
            pairs = [x / y for x, y in zip(a[key], b[key])]
            print(f"{key:32s} A {ma:10.1f}  B {mb:10.1f}  A/B {ma / mb:5.2f}  [{min(pairs):.2f}-{max(pairs):.2f}]")
    # B's floors: a floor does not depend on the build, but an older build may lack the engine's copy.
    floors = {key[len("floor "):]: v for key, v in b.items() if key.startswith("floor ")}
    if not floors:
        return
    print("\n# floor F: median over B's runs of the local stand-in moving the bytes any design must move on a rank "
          "(slowest rank);\n# A/2 is 2x faster than build A; 'under F': 2x needs the bytes moved faster than F "
          "moves them; B/F how far B is above the floor")
    for key, fv in floors.items():
        if key in a and key in b:
            ma, mb, mf = statistics.median(a[key]), statistics.median(b[key]), statistics.median(fv)
            if ma / 2 >= mf:
                verdict = "above F"
            elif mf >= VERDICT_MIN_FLOOR_US:
                verdict = "under F: 2x needs a faster copy than any measured"
            else:  # the stand-ins' own call overhead (a few µs) is a large part of a small F
                verdict = "under F, but F is too small to decide"
            if mb < mf:
                verdict += "; B beats F: no floor here"
            print(f"{key:32s} F {mf:10.1f}  A/2 {ma / 2:10.1f}  B/F {mb / mf:5.2f}  "
                  f"F range [{min(fv):.1f}-{max(fv):.1f}]  {verdict}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--symmetric", action="store_true",
                   help="every buffer from the group's symmetric heap (tunedist.symmetric_empty; zero-copy from "
                        "TUNEDIST_SYMMETRIC_MIN_BYTES, or as measured): builds that have it only")
    p.add_argument("--fresh", action="store_true",
                   help="every call first writes its input (the root's buffer for broadcast), timed: the input is "
                        "in its owner's cache, as in training, instead of wherever an earlier call left it")
    p.add_argument("--floor", action="store_true",
                   help="time each point's floor beside it (see the module docstring); any build runs it")
    p.add_argument("--compare", nargs=2, metavar=("A_FILES", "B_FILES"),
                   help="comma-separated JSON files of build A and of build B: print the ratios, run nothing")
    args = p.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    import tunedist  # noqa: PLC0415  (--compare needs no build)

    with process_group("tuned") as (rank, _):
        load0 = load_avg()[0]
        empty = tunedist.symmetric_empty if args.symmetric else torch.empty
        points = measure(args.sizes, args.rounds, empty, args.fresh, args.floor)
        if rank == 0:
            for key, r in points.items():
                print(f"{key:32s} {r['p50_us']:10.1f} us")
            if args.json:
                write_json(args.json, {**run_meta(), "symmetric": args.symmetric, "fresh": args.fresh,
                                       "load_before_after": [load0, load_avg()[0]], "points": points})
    return 0


if __name__ == "__main__":
    sys.exit(main())
