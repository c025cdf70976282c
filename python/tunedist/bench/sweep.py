"""The measuring loop of `python -m tunedist.bench`: the points of a sweep in order, each contender's check, warm-up
and loop size, the interleaved timed rounds, and the row each point gives; the memcpy probe and the all_reduce
stand-in that take turns at the bound point. Conventions: tunedist.bench's docstring."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import tunedist

from .collectives import ALL_COLLECTIVES, DTYPES, VARIANTS, count_wrong
from .contenders import Contender
from .standin import AllreduceStandin, StandinUnavailable
from .symmetric import zero_copy_row

DEFAULT_WARMUP = 5
PERCENTILES = {"p10_us": 0.10, "p50_us": 0.50, "p90_us": 0.90, "p99_us": 0.99}


def over_ranks(values, how: int) -> list:
    """Reduces per-rank floats over ranks (on the default group) as -a says; every rank gets the result."""
    t = torch.tensor(values, dtype=torch.float64)
    if how == 0:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t, op={1: dist.ReduceOp.SUM, 2: dist.ReduceOp.MIN, 3: dist.ReduceOp.MAX}[how])
        if how == 1:
            t /= dist.get_world_size()
    return t.tolist()


def _timed(call, n: int) -> list:
    stamps = [0.0] * (n + 1)
    stamps[0] = time.perf_counter()
    for i in range(n):  # back to back, no barrier: the nccl-tests loop
        call()
        stamps[i + 1] = time.perf_counter()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _percentile(sorted_times, q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, max(0, round(q * len(sorted_times)) - 1))]


def device_of(args) -> torch.device:
    if args.device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _synchronized(call):
    """A CUDA call returns once its kernels are queued; time it until they have run, as nccl-tests does."""
    def run():
        call()
        torch.cuda.synchronize()
    return run


@dataclass
class Point:
    """One contender at one (op, variant, count): its buffers, check and loop size, then its timed rounds."""

    contender: Contender
    op: str
    inplace: bool
    count: int
    call: Callable[[], object]
    wrong: int
    path: str
    warmup: int = 0
    iters: int = 0
    rounds: list = field(default_factory=list)  # per round: this rank's per-iteration times (s)
    cpu_s: float = 0.0  # this rank's CPU time over all timed loops
    calls: int = 0  # calls of the op at this point: check, warm-up and every round's untimed call and loop
    heap0: dict | None = None  # a symmetric contender's heap counters before the point

    @property
    def timed(self) -> bool:
        return self.contender.time_wrong or not self.wrong


def prepare(args, contender, op, inplace, count) -> Point:
    """Buffers, the check (which also shows the path a deepspeed call takes), the warm-up and the loop size."""
    world, dtype, coll = dist.get_world_size(), DTYPES[args.dtype], ALL_COLLECTIVES[op]
    with device_of(args):  # buffers and expected values on --device
        bufs = coll.buffers(dist.get_rank(), world, inplace, count, dtype, args.redop, contender.comm)
    call = _synchronized(bufs.call) if args.device == "cuda" else bufs.call
    heap0 = contender.heap_stats() if contender.symmetric else None
    checked = bool(args.check or contender.always_check)
    start = time.perf_counter()
    with contender.observe() as seen:
        wrong_here = count_wrong(bufs) if checked else 0
    first_s = time.perf_counter() - start
    n_wrong, first_s = over_ranks([wrong_here, first_s], 1)  # everyone must agree on the counts below
    point = Point(contender, op, inplace, count, call, round(n_wrong * world), seen.path(), calls=int(checked),
                  heap0=heap0)
    if not point.timed:
        return point
    point.warmup = args.warmup if args.warmup is not None else max(1, min(DEFAULT_WARMUP, int(args.target_s /
                                                                                              first_s)))
    warm = sorted(_timed(call, point.warmup))
    point.calls += point.warmup
    (est_s,) = over_ranks([warm[len(warm) // 2]], 3)
    point.iters = args.iters or min(args.max_iters, max(args.min_iters, round(args.target_s / max(est_s, 1e-9))))
    return point


def run_round(point: Point) -> None:
    """One timed loop: after a barrier on the control group and one untimed call, as every round starts."""
    dist.barrier()
    point.call()
    cpu0 = time.process_time()
    point.rounds.append(_timed(point.call, point.iters))
    point.cpu_s += time.process_time() - cpu0
    point.calls += 1 + point.iters


def finish(args, point: Point) -> dict:
    """The point's row: times reduced over ranks (-a), the median over rounds, percentiles, bandwidths."""
    world, coll = dist.get_world_size(), ALL_COLLECTIVES[point.op]
    row = {"backend": point.contender.name, "op": point.op, "dtype": args.dtype,
           "redop": args.redop if coll.reduces else "none", "count": point.count, "inplace": point.inplace,
           "bytes": coll.nbytes(point.count, DTYPES[args.dtype].itemsize, world), "wrong": point.wrong,
           "path": point.path, "rounds": len(point.rounds), "iters": point.iters, "warmup": point.warmup}
    if point.heap0 is not None:
        row.update(zero_copy_row(point.contender, point.heap0, point.calls, row["bytes"]))
    if not point.timed:
        return {**row, **dict.fromkeys(("time_us", *PERCENTILES, "algbw_gbps", "busbw_gbps", "cpu_us",
                                        "cpu_all_ranks_us")), "round_time_us": [], "not_timed": "wrong results"}
    pooled = sorted(t for times in point.rounds for t in times)
    per_rank = [sum(times) / len(times) for times in point.rounds] + [_percentile(pooled, q) for q in
                                                                      PERCENTILES.values()]
    reduced = over_ranks(per_rank, args.average)
    round_s, pct = reduced[:len(point.rounds)], reduced[len(point.rounds):]
    (cpu_s,) = over_ranks([point.cpu_s / len(pooled)], 1)
    time_s = statistics.median(round_s)
    algbw = row["bytes"] / time_s / 1e9
    return {**row, "time_us": time_s * 1e6, "round_time_us": [t * 1e6 for t in round_s],
            **{k: v * 1e6 for k, v in zip(PERCENTILES, pct)}, "algbw_gbps": algbw,
            "busbw_gbps": algbw * coll.busbw_factor(world), "cpu_us": cpu_s * 1e6,
            "cpu_all_ranks_us": cpu_s * world * 1e6}


def plan(args, world: int) -> list:
    """(op, count) pairs in sweep order, one per distinct S (small sizes round up to one element per rank)."""
    itemsize, points = DTYPES[args.dtype].itemsize, []
    for op in args.ops:
        per = ALL_COLLECTIVES[op].nbytes(1, itemsize, world)
        size, seen = args.min_bytes, set()
        while size <= args.max_bytes:
            count = max(1, size // per)
            if count not in seen:
                seen.add(count)
                points.append((op, count))
            size *= args.step_factor
    return points


def measure_point(args, contenders, op, count, inplace, progress, probe=False, notes=None) -> list:
    """One (op, count, variant): the contenders that have the op, interleaved round by round; their rows. Its
    buffers die on return, before the next point allocates its own (tuned+sym: the heap's peak is one point's).
    probe: the memcpy probe and the all_reduce stand-in (make_standin) also take turns, first in every round (the
    bound point), and each row keeps them; `notes` gets why the stand-in did not run, where it did not."""
    here = [prepare(args, c, op, inplace, count) for c in contenders if c.has(op)]
    standin = make_standin(args, count, notes) if probe else None
    probes, standins = [], []
    try:
        for k in range(args.rounds):
            if probe:
                probes.append(measure_memcpy(args))
            if standin is not None:
                standins.append(standin.time_us(over_ranks=lambda v: over_ranks(v, args.average)))
            for point in here:
                if point.timed:
                    run_round(point)
                progress.step(f"{point.contender.name} {op} {count} el{' in-place' if inplace else ''} round {k + 1}")
    finally:
        if standin is not None:
            standin.close()
    rows = [finish(args, point) for point in here]
    if probe:
        for row in rows:
            row["memcpy_gbps_rounds"] = probes
            if standins:
                row["standin_us_rounds"] = standins
    return rows


def make_standin(args, count: int, notes):
    """The all_reduce stand-in (tunedist.bench.standin) of `count` elements, checked; None where it cannot run (one
    rank; a GPU run; no shared memory between the ranks, or ranks on several hosts: the reason goes to `notes`). Its
    failures to start come on every rank at once (StandinUnavailable), so all ranks take the same path. A wrong result
    fails the run: the bound must come from a correct execution."""
    if dist.get_world_size() < 2:
        return None
    if args.device != "cpu":
        if notes is not None:
            notes.append("all_reduce stand-in not measured: it runs on CPU memory only")
        return None
    try:
        standin = AllreduceStandin(count, DTYPES[args.dtype])
    except StandinUnavailable as e:
        if notes is not None:
            notes.append(f"all_reduce stand-in not measured: {e}")
        return None
    try:
        wrong = standin.check()
    except BaseException:
        standin.close()
        raise
    if wrong:
        standin.close()
        raise RuntimeError(f"tunedist.bench: the all_reduce stand-in of {count} elements got {wrong} wrong elements")
    return standin


def bound_point(args, world: int):
    """(op, count, inplace) of the point the all_reduce bound is read at: the largest all_reduce, in place."""
    counts = [count for op, count in plan(args, world) if op == "all_reduce"]
    return ("all_reduce", max(counts), True) if counts else None


def measure(args, contenders, progress, notes=None) -> list:
    """Every point of plan(), in order; their rows (`notes`: see measure_point)."""
    at = bound_point(args, dist.get_world_size())
    return [row for op, count in plan(args, dist.get_world_size()) for inplace in VARIANTS[op]
            for row in measure_point(args, contenders, op, count, inplace, progress, (op, count, inplace) == at,
                                     notes)]


def measure_memcpy(args, reps: int = 5) -> float:
    """Per-rank copy bandwidth (GB/s) with every rank copying at once: median per rank, mean over ranks. Buffers are
    allocated and touched first, and a barrier starts each timed copy, so the ranks' copies overlap (a rank still
    paging its buffers in while the other copies alone would measure one rank's bandwidth instead)."""
    nbytes = max(args.memcpy_bytes, args.max_bytes)
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    tunedist._C.copy_gbps(dst, src)
    runs = []
    for _ in range(reps):
        dist.barrier()
        runs.append(tunedist._C.copy_gbps(dst, src))
    runs.sort()
    return over_ranks([runs[len(runs) // 2]], 1)[0]
