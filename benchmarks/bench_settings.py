"""Compares settings of the `tuned` backend side by side in one job: one `tuned` group per setting, each created
with its own environment (tunedist reads its TUNEDIST_* options when a group is created), taking turns size by size.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_settings.py --ops broadcast \\
        --setting before:TUNEDIST_BROADCAST_STREAM_BELOW_BYTES=0 --setting now: --sizes 16K,64K,256K,1M
    torchrun --standalone --nproc_per_node=2 benchmarks/bench_settings.py --ops all_reduce,all_gather \\
        --setting cached:TUNEDIST_SLOT_STORES=cached --setting streaming:TUNEDIST_SLOT_STORES=streaming \\
        --setting auto:TUNEDIST_SLOT_STORES=auto

A setting is NAME:VAR=VALUE,VAR=VALUE (NAME: alone keeps the environment as it is). The first is the baseline.
The buffers and their closed-form results are tunedist.bench's (all_reduce and broadcast in place, all_gather and
reduce_scatter out of place, as its summary compares them). At each (op, size) every setting's result is checked
once, warmed up, then the settings take turns for --rounds rounds, the order reversed every other round; each turn
is a barrier, one untimed call and a loop of back-to-back calls, timed as its mean per call (total / iters, so a
rank that runs ahead of its peers, as a broadcast root can, does not flatter the loop), averaged over ranks.
Printed per setting: the median over rounds of that time, and its ratio to the baseline's time in the same round,
median [min-max] (< 1: faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
from _common import loop_mean_s, over_ranks, parse_sizes, process_group, ranks_failing, run_meta, spread, write_json

import tunedist
from tunedist.bench.collectives import ALL_COLLECTIVES, ALL_OPS, DTYPES, count_wrong
from tunedist.bench.contenders import C10dComm


def parse_setting(text: str) -> tuple:
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"bad setting {text!r}: use NAME:VAR=VALUE,VAR=VALUE (or NAME: for none)")
    env = {}
    for item in filter(None, rest.split(",")):
        var, eq, value = item.partition("=")
        if not eq or not var.startswith("TUNEDIST_"):
            raise argparse.ArgumentTypeError(f"bad setting {text!r}: {item!r} is not TUNEDIST_VAR=VALUE")
        env[var] = value
    return name, env


def print_stores(names: list, stores: list) -> None:
    """One line per setting whose stores are chosen at run time: each size class of the round chooser (all_reduce
    one-shot and two-shot, all_gather, reduce_scatter, broadcast) as op>=bytes, then each rank's last pick (c cached,
    s streaming) and its last medians in ns per byte, cached/streaming."""
    for name in names:
        if stores[0][name].get("mode") != "auto":
            continue
        classes = {}
        for rank_stats in stores:
            for r in rank_stats[name]["round_chooser"]:
                medians = f"{r['cached_ns_per_byte']:.3f}/{r['streaming_ns_per_byte']:.3f}"
                pick = f"{'s' if r['streaming'] else 'c'}({medians})"
                classes.setdefault(f"{r['op']}>={r['slot_bytes_from'] // 1024}K", []).append(pick)
        print(f"# {name}: last slot-store picks per rank: " + "; ".join(f"{k} {' '.join(v)}"
                                                                         for k, v in classes.items()), flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--setting", dest="settings", action="append", type=parse_setting, required=True,
                   help="NAME:VAR=VALUE,... (repeat; the first is the baseline)")
    p.add_argument("--ops", default="all_reduce", help=f"comma-separated, from {', '.join(ALL_OPS)}")
    p.add_argument("--sizes", type=parse_sizes, default="16K,64K,256K,1M,4M",
                   help="bytes per call: the all_reduce/broadcast buffer, the all_gather output, the reduce_scatter "
                        "input")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--target-s", type=float, default=0.05, help="seconds one timed loop aims at")
    p.add_argument("--min-iters", type=int, default=3, help="calls per timed loop at least, however slow a call")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--json", help="write every round's times here (rank 0)")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    names = [n for n, _ in args.settings]
    if len(set(names)) != len(names) or len(names) < 2:
        p.error(f"need at least two settings with distinct names, got {names}")
    if any(o not in ALL_OPS for o in args.ops):
        p.error(f"unknown op in {args.ops}; choose from {', '.join(ALL_OPS)}")
    if args.rounds < 1 or args.min_iters < 1:
        p.error("need --rounds >= 1 and --min-iters >= 1")
    return args


def make_comms(settings) -> dict:
    """One tuned group per setting, each created under its own TUNEDIST_* environment, restored afterwards."""
    saved = dict(os.environ)
    comms = {}
    try:
        for name, env in settings:
            os.environ.update(env)
            comms[name] = C10dComm("tuned")
            os.environ.clear()
            os.environ.update(saved)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return comms


def make_call(op: str, nbytes: int, dtype, comm, rank: int, world: int):
    """(call, check) for one op of S = `nbytes` (tunedist.bench's S, the variant its summary compares), with
    tunedist.bench's buffers and closed-form results: check() runs the op once and says whether it was right."""
    coll = ALL_COLLECTIVES[op]
    count = max(1, nbytes // coll.nbytes(1, dtype.itemsize, world))
    bufs = coll.buffers(rank, world, coll.summary_inplace, count, dtype, "sum", comm)
    return bufs.call, lambda: count_wrong(bufs) == 0


def mean_over_ranks(x: float) -> float:
    return over_ranks([x], mean=True)[0]


def measure_point(args, comms, op, nbytes, rank, world) -> dict:
    calls = {name: make_call(op, nbytes, DTYPES[args.dtype], c, rank, world) for name, c in comms.items()}
    iters = {}
    for name, (call, check) in calls.items():
        failing = ranks_failing(check())
        if failing:
            raise RuntimeError(f"bench_settings: {op} of {nbytes} B under setting {name!r} gave wrong results on "
                               f"{failing} rank(s)")
        est = mean_over_ranks(loop_mean_s(call, 3))
        iters[name] = max(args.min_iters, min(5000, round(args.target_s / max(est, 1e-9))))
    per_round = {name: [] for name in calls}
    order = list(calls)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            call = calls[name][0]
            dist.barrier()
            call()
            per_round[name].append(mean_over_ranks(loop_mean_s(call, iters[name])) * 1e6)
    base = order[0]
    rows = {}
    for name, times in per_round.items():
        ratios = [t / b for t, b in zip(times, per_round[base])]
        rows[name] = {"time_us": statistics.median(times), "round_time_us": times, "iters": iters[name],
                      **spread(ratios, "ratio_")}
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    with process_group("gloo") as (rank, world):
        comms = make_comms(args.settings)
        record = run(args, comms, rank, world)
        if rank == 0 and args.json:
            write_json(args.json, {**run_meta(), **record})
        dist.barrier()  # every rank is done with the settings' groups
        for c in comms.values():
            c.close()
    return 0


def run(args, comms: dict, rank: int, world: int) -> dict:
    """Every (op, size) in turn, printed as it comes; the record: the results and each group's memory and stores."""
    names = list(comms)
    if rank == 0:
        print(f"# bench_settings: world size {world}, {args.dtype}, {args.rounds} rounds; settings: " +
              "; ".join(f"{n} {env or '(environment as is)'}" for n, env in args.settings) +
              f"; time = median over rounds of the loop's mean per call (us); ratio = time / {names[0]}'s in the "
              "same round, median [min-max]", flush=True)
    results = []
    for op in args.ops:
        for nbytes in args.sizes:
            rows = measure_point(args, comms, op, nbytes, rank, world)
            results.append({"op": op, "bytes": nbytes, "settings": rows})
            if rank == 0:
                print(f"{op:>15} {nbytes:>10}  " + "  ".join(
                    f"{n} {r['time_us']:9.2f}" + ("" if n == names[0] else
                                                   f" ({r['ratio_median']:.2f} [{r['ratio_min']:.2f}-"
                                                   f"{r['ratio_max']:.2f}])")
                    for n, r in rows.items()), flush=True)
    # What each group reserved in shared memory (TUNEDIST_SLOT_BYTES shows here): the settings took effect.
    shm = {name: tunedist._C.reserved_shm_bytes(c.group._get_backend(torch.device("cpu"))) for name, c in comms.items()}
    # Each rank's slot stores at the end, per setting (tunedist._C.slot_store_stats): which way the auto mode went.
    stores = [None] * world
    dist.all_gather_object(stores, {name: tunedist._C.slot_store_stats(c.group._get_backend(torch.device("cpu")))
                                    for name, c in comms.items()})
    if rank == 0:
        print_stores(names, stores)
    return {"dtype": args.dtype, "rounds": args.rounds, "settings": dict(args.settings), "reserved_shm_bytes": shm,
            "slot_stores": stores, "results": results}


if __name__ == "__main__":
    sys.exit(main())
