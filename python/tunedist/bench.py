"""nccl-tests-style benchmark of the `tuned` backend against gloo (or any CPU c10d backend) and DeepSpeed's CPU
shared-memory all_reduce, interleaved in one run.

    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,gloo \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast -b 8 -e 256M -f 2 --json out.json --plot out.png
    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,gloo,deepspeed --ops all_reduce -b 4K -e 64M -f 4
    torchrun --nproc_per_node=1 -m tunedist.bench --device cuda --backends tuned,nccl   # CUDA buffers (one GPU)
    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,tuned+sym \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast -b 64K -e 64M -f 4   # copying vs zero-copy

Contenders (tunedist.bench_contenders): each name in --backends is a c10d backend with a group of its own, or
`deepspeed`, deepspeed.comm.inference_all_reduce (pip install deepspeed; all_reduce only, its other ops are skipped
with a note; the bench sets DS_ACCELERATOR=cpu and LOCAL_SIZE when unset), or `tuned+sym`, a tuned group of its own
whose buffers (every tensor passed to the op: out-of-place inputs and outputs too) come from that group's symmetric
heap (tunedist.symmetric_empty) instead of torch.empty, so that a point whose S is at least the group's zero-copy
threshold (TUNEDIST_SYMMETRIC_MIN_BYTES; by default 256 KiB, or 2 MiB where the ranks outnumber the cores) runs
zero-copy (tunedist.symmetric), or `tuned-op`, a tuned group of its own called through tunedist's operators
(tunedist.all_reduce and the others: the same engine, without torch.distributed's Python layer; all_reduce,
all_gather, reduce_scatter and broadcast), or `deepspeed-op`, DeepSpeed's
kernel torch.ops.deepspeed.inference_all_reduce_ called without its Python API (SUM only). The conventions follow
nccl-tests
(doc/PERFORMANCE.md; docs/anchors.md part 1, sections 7 and 8):
- Interleaving: at each point (op, variant, size) every contender is checked and warmed up, then the contenders take
  turns, one timed loop each, for --rounds rounds (A B C A B C ...), so load drift on a shared machine hits them
  alike. Each loop starts after a barrier on the control group and one untimed call.
- time: the median over rounds of each round's mean time per op of a loop of back-to-back calls with no barrier
  between them (total / iters). It is averaged over ranks (-a 1, the nccl-tests default; -a 0 takes rank 0, 2 the
  min, 3 the max). p10/p50/p90/p99 are the percentiles of each rank's per-iteration times, pooled over the rounds (as
  gloo's benchmark reports them), reduced over ranks the same way.
- summary: every contender's time over the first one's, per round (round k of both ran back to back), as the median
  ratio and its spread (min-max over rounds).
- algbw = S / time with 1 GB = 1e9 B. busbw = algbw x factor:
      all_reduce      S = count x typesize (the per-rank buffer)          factor 2(n-1)/n
      all_gather      S = n x count x typesize (the gathered array)       factor (n-1)/n
      reduce_scatter  S = n x count x typesize (the array scattered)      factor (n-1)/n
      broadcast       S = count x typesize                                factor 1
    and, when named in --ops (roots rank 0; reduce in place, the others out of place):
      all_to_all      S = n x count x typesize (each rank's array)        factor (n-1)/n
      reduce          S = count x typesize                                factor 1
      gather          S = n x count x typesize (the gathered array)       factor (n-1)/n
      scatter         S = n x count x typesize (the array scattered)      factor (n-1)/n
  size(B) is S and count is the elements per rank (all_gather: its input; reduce_scatter: its output).
  bench_collectives.ALL_COLLECTIVES holds one record per op with these facts and its buffers (nccl-tests' testColl).
- Out-of-place and in-place: torch's all_reduce and broadcast work in place only. The out-of-place all_reduce is the
  copy a caller needs (out.copy_(in)) plus the in-place op, and broadcast has only the in-place column. In place,
  all_gather's input is the rank's own chunk of the output and reduce_scatter's output is its chunk of the input.
  The summary compares all_reduce and broadcast in place, and all_gather and reduce_scatter out of place (reduce in
  place, all_to_all, gather and scatter out of place).
- #wrong: the elements that differ from the closed form after one verification call made before the warm-up (so
  never inside the timed loop), summed over ranks. Inputs are small integers, exact in every dtype, so any
  difference is an error. deepspeed is always checked, and a deepspeed point with wrong elements is not timed (its
  API returns wrong results silently: see bench_contenders.DEEPSPEED_NOTES); the row says so, with #wrong.
- Iterations: -n and -w fix them. Otherwise the warm-up takes up to 5 calls and the loop is sized to take about
  --target-s seconds (3 to 1000 calls), from timings that all ranks agree on; each round runs that many.
- cpu: the CPU time of each rank's process over the timed loops (time.process_time(): every thread, the backend's
  own and the kernel's work for its sockets included) per op, summed over ranks (cpu_all_ranks_us; cpu_us is the
  mean per rank). Where the ranks share a machine of C cores, no op can take less than that sum / C of wall time:
  the summary prints it beside the times so a CPU-bound comparison shows as one.
- memcpy_gbps: the per-rank bandwidth of the engine's copy routine (tunedist._C.copy_gbps) while all ranks
  copy at once (buffers touched first, a barrier before each of 5 copies), probed before the first point; the
  median of each rank, then the mean over ranks. memcpy_gbps_end: the same probe after the last point (on a shared
  VM the probe moves 1.5x within minutes, so one probe says little about the minutes between). bound: the
  all_reduce ceiling of a two-shot algorithm with copy-in/out, 4(P-1)/(5P+1) x the mean of the two probes, and
  each backend's busbw over it at the largest size. At that point (the largest all_reduce, in place) the probe also
  takes a turn in every round, first, so memory speed is measured seconds from each timed loop
  (memcpy_gbps_rounds in its rows), and bound.beside_rounds holds each backend's busbw there over 4(P-1)/(5P+1) and
  over 4(P-1)/(3P+1) (a design that copies in only what peers need and reduces in place) x the probe of its own
  round: per round, their median and min-max. The memcpy probe copies within a core; a collective moves bytes
  between cores, which costs more where the ranks' CPUs sit far apart and less where they share a core's caches. So
  at the same point that design itself also takes a turn in every round, run with plain kernels on shared memory
  between the ranks (tunedist.bench_standin; CPU runs of 2 or more ranks): standin_us_rounds in the rows, and
  beside_rounds' "standin", the stand-in's time over each round's (> 1: the collective beats the design as these
  CPUs run it). Where the ranks cannot map each other's memory the notes say why.
- load_avg_start/end: os.getloadavg() on rank 0 before the first and after the last point.
- zero-copy (tuned+sym only): the growth of symmetric_heap_stats()["zero_copy_ops"] over a point (its check, warm-up
  and rounds; the least over ranks) next to the calls the point made, in the row (zero_copy_ops, calls,
  copy_restarts, zero_copy_expected: S >= the threshold on a one-host group) and as the path (zero-copy, copying or
  mixed). meta["symmetric"] has the run's totals and the heap's (reserved_bytes and peak_in_use_bytes, the most over
  ranks). A point expected to run zero-copy that did not, or a run with no zero-copy call, is printed as a WARNING
  (stdout and stderr); below the threshold every call takes the copying path, as it should.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import tunedist

from . import bench_contenders
from .bench_collectives import ALL_COLLECTIVES, ALL_OPS, DTYPES, OPS, PRIMARY_INPLACE, REDOPS, VARIANTS, count_wrong
from .bench_report import RANK_REDUCTIONS, Progress, bound_section, print_tables, ratios
from .bench_standin import AllreduceStandin, StandinUnavailable
from .bench_symmetric import symmetric_section, warn_zero_copy, zero_copy_row

DEFAULT_WARMUP = 5
PERCENTILES = {"p10_us": 0.10, "p50_us": 0.50, "p90_us": 0.90, "p99_us": 0.99}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes such as 8, 4K, 64KiB, 256M, 1G")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def _csv(allowed, what):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if allowed is not None and s not in allowed]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(allowed)}")
        return items
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tunedist.bench", description=__doc__.split("\n")[0],
                                epilog="Run it under torchrun; rank 0 prints. Conventions: see the module docstring.")
    p.add_argument("--backends", type=_csv(None, "backend"), default=["tuned", "gloo"],
                   help="comma-separated CPU c10d backends, deepspeed, deepspeed-op, tuned-op and/or tuned+sym (a "
                        "tuned group on buffers from its symmetric heap: zero-copy from TUNEDIST_SYMMETRIC_MIN_BYTES, "
                        "default 256K, 2M with more ranks than cores), all measured in this run, interleaved; the "
                        "summary compares each "
                        "with the first (default tuned,gloo)")
    p.add_argument("--ops", type=_csv(ALL_OPS, "op"), default=list(OPS),
                   help="comma-separated, default the four above; also all_to_all, reduce, gather, scatter")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--step-factor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, help="timed calls per point and round (default: adaptive, --target-s)")
    p.add_argument("-w", "--warmup", type=int, help=f"warm-up calls per point (default: up to {DEFAULT_WARMUP})")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point: A B C A B C ... (default 3)")
    p.add_argument("--target-s", type=float, default=0.25, help="seconds an adaptive timed loop aims at")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("-d", "--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("-o", "--op", dest="redop", choices=sorted(REDOPS), default="sum")
    p.add_argument("-a", "--average", type=int, choices=sorted(RANK_REDUCTIONS), default=1,
                   help="reduce times over ranks: 0 rank 0, 1 average (default), 2 min, 3 max")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="count wrong elements (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the buffers live (cuda: cuda:LOCAL_RANK; each call then waits for its kernels)")
    p.add_argument("--memcpy-bytes", type=parse_size, default=256 << 20,
                   help="buffer of the memcpy probe; at least --max-bytes is used (default 256M)")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--plot", help="draw busbw and time against size into this image (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)
    for b in args.backends:
        problem = _backend_problem(b, args.device)
        if problem:
            p.error(problem)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False here")
    if not 1 <= args.min_bytes <= args.max_bytes or args.step_factor < 2:
        p.error("need 1 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib, which is not installed (pip install matplotlib), or drop --plot")
    return args


def _backend_problem(name: str, device: str) -> str | None:
    if name in (bench_contenders.DEEPSPEED, bench_contenders.DEEPSPEED_OP):
        return bench_contenders.deepspeed_problem(device)
    if name == bench_contenders.TUNED_SYM:
        return bench_contenders.symmetric_problem(device)
    caps = dist.Backend.backend_capability.get("tuned" if name == bench_contenders.TUNED_OP else name.lower())
    if caps is None:
        return (f"unknown backend {name!r}: registered are {', '.join(sorted(dist.Backend.backend_capability))}, "
                f"and {', '.join(bench_contenders.OTHER_CONTENDERS)}")
    if device not in caps:
        return f"backend {name!r} does not serve {device} tensors (devices {caps}); see --device"
    return None


def _over_ranks(values, how: int) -> list:
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


def _device(args) -> torch.device:
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

    contender: bench_contenders.Contender
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
    with _device(args):  # buffers and expected values on --device
        bufs = coll.buffers(dist.get_rank(), world, inplace, count, dtype, args.redop, contender.comm)
    call = _synchronized(bufs.call) if args.device == "cuda" else bufs.call
    heap0 = contender.heap_stats() if contender.symmetric else None
    checked = bool(args.check or contender.always_check)
    start = time.perf_counter()
    with contender.observe() as seen:
        wrong_here = count_wrong(bufs) if checked else 0
    first_s = time.perf_counter() - start
    n_wrong, first_s = _over_ranks([wrong_here, first_s], 1)  # everyone must agree on the counts below
    point = Point(contender, op, inplace, count, call, round(n_wrong * world), seen.path(), calls=int(checked),
                  heap0=heap0)
    if not point.timed:
        return point
    point.warmup = args.warmup if args.warmup is not None else max(1, min(DEFAULT_WARMUP, int(args.target_s /
                                                                                              first_s)))
    warm = sorted(_timed(call, point.warmup))
    point.calls += point.warmup
    (est_s,) = _over_ranks([warm[len(warm) // 2]], 3)
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
    reduced = _over_ranks(per_rank, args.average)
    round_s, pct = reduced[:len(point.rounds)], reduced[len(point.rounds):]
    (cpu_s,) = _over_ranks([point.cpu_s / len(pooled)], 1)
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
                standins.append(standin.time_us(over_ranks=lambda v: _over_ranks(v, args.average)))
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
    """The all_reduce stand-in (tunedist.bench_standin) of `count` elements, checked; None where it cannot run (one
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
    return _over_ranks([runs[len(runs) // 2]], 1)[0]


def plot(results, meta, path: str):
    """The --plot figure (tunedist.bench_plot); returns the matplotlib Figure."""
    from .bench_plot import plot as draw  # noqa: PLC0415  (matplotlib is optional)

    return draw(results, meta, path, PRIMARY_INPLACE)


def _meta(args, world, contenders) -> dict:
    skipped = [{"backend": c.name, "op": op, "reason": f"{c.name} has {', '.join(c.ops)} only"}
               for c in contenders for op in args.ops if not c.has(op)]
    return {"world_size": world, "device": args.device, "memcpy_gbps": measure_memcpy(args),
            "simd": tunedist.simd_level(), "torch": torch.__version__, "tunedist": tunedist.version(),
            "average": RANK_REDUCTIONS[args.average], "rounds": args.rounds, "backends": args.backends,
            "threads": {"torch_num_threads": torch.get_num_threads(), "requested": args.threads,
                        "torch_num_interop_threads": torch.get_num_interop_threads(),
                        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
            "contenders": {c.name: c.info for c in contenders if c.info}, "skipped": skipped,
            "notes": [n for c in contenders for n in c.notes], "primary_inplace": PRIMARY_INPLACE}


def _load_avg() -> list:
    return _over_ranks(list(os.getloadavg()), 0)  # rank 0's: the ranks share the machine


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")  # control traffic only; every measured contender gets a group of its own
    rank, world = dist.get_rank(), dist.get_world_size()
    contenders = [bench_contenders.make(b) for b in args.backends]
    if args.device == "cuda":
        torch.cuda.set_device(_device(args))
    meta = {**_meta(args, world, contenders), "load_avg_start": _load_avg()}
    heap0 = {c.name: c.heap_stats() for c in contenders if c.symmetric}
    total = sum(len(VARIANTS[op]) * sum(c.has(op) for c in contenders) for op, _ in plan(args, world)) * args.rounds
    progress = Progress(total, rank == 0 and not args.no_progress)
    results = measure(args, contenders, progress, meta.setdefault("notes", []))
    progress.close()
    meta["load_avg_end"] = _load_avg()
    meta["memcpy_gbps_end"] = measure_memcpy(args)
    if "tuned" in args.backends:  # hosts the tuned group spans (hierarchical collectives over gloo when more than one)
        group = contenders[args.backends.index("tuned")].comm.group
        meta["tuned_hosts"] = tunedist._C.host_layout(group._get_backend(torch.device("cpu")))
    meta["bound"] = bound_section(results, world, (meta["memcpy_gbps"] + meta["memcpy_gbps_end"]) / 2)
    meta["summary"] = ratios(results, PRIMARY_INPLACE, args.backends[0])
    meta["symmetric"] = {c.name: symmetric_section(c, heap0[c.name], results) for c in contenders if c.symmetric}
    if rank == 0:
        if len(meta.get("tuned_hosts", [])) > 1:
            print(f"# tuned spans {len(meta['tuned_hosts'])} hosts: {meta['tuned_hosts']} (TUNEDIST_HOST_ID)")
        print_tables(results, args, meta)
        warn_zero_copy(meta["symmetric"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**meta, "results": results}, f, indent=1)
        if args.plot:
            plot(results, meta, args.plot)
    dist.barrier()
    for c in contenders:
        c.comm.close()
    dist.destroy_process_group()
    return 1 if any(r["wrong"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
