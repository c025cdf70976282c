"""nccl-tests-style benchmark of the `tuned` backend against gloo (or any CPU c10d backend), in one run.

    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,gloo \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast -b 8 -e 256M -f 2 --json out.json --plot out.png
    torchrun --nproc_per_node=1 -m tunedist.bench --device cuda --backends tuned,nccl   # CUDA buffers (one GPU)

The conventions follow nccl-tests (doc/PERFORMANCE.md; docs/anchors.md part 1, sections 7 and 8):
- time: the mean time per op of a loop of back-to-back calls with no barrier between them (total / iters). It is
  averaged over ranks (-a 1, the nccl-tests default; -a 0 takes rank 0, 2 the min, 3 the max). p50/p99 are the
  percentiles of each rank's per-iteration times in the same loop (as gloo's benchmark reports them), reduced over
  ranks the same way.
- algbw = S / time with 1 GB = 1e9 B. busbw = algbw x factor:
      all_reduce      S = count x typesize (the per-rank buffer)          factor 2(n-1)/n
      all_gather      S = n x count x typesize (the gathered array)       factor (n-1)/n
      reduce_scatter  S = n x count x typesize (the array scattered)      factor (n-1)/n
      broadcast       S = count x typesize                                factor 1
  size(B) is S and count is the elements per rank (all_gather: its input; reduce_scatter: its output). COLLECTIVES
  below holds one record per op with these facts and its buffers, as nccl-tests' struct testColl.
- Out-of-place and in-place: torch's all_reduce and broadcast work in place only. The out-of-place all_reduce is the
  copy a caller needs (out.copy_(in)) plus the in-place op, and broadcast has only the in-place column. In place,
  all_gather's input is the rank's own chunk of the output and reduce_scatter's output is its chunk of the input.
  The summary compares all_reduce and broadcast in place, and all_gather and reduce_scatter out of place.
- #wrong: the elements that differ from the closed form after one verification call made before the warm-up (so
  never inside the timed loop), summed over ranks. Inputs are small integers, exact in every dtype, so any
  difference is an error.
- Iterations: -n and -w fix them. Otherwise the warm-up takes up to 5 calls and the loop is sized to take about
  --target-s seconds (3 to 1000 calls), from timings that all ranks agree on.
- cpu: the CPU time of each rank's process over the timed loop (time.process_time(): every thread, the backend's
  own and the kernel's work for its sockets included) per op, summed over ranks (cpu_all_ranks_us; cpu_us is the
  mean per rank). Where the ranks share a machine of C cores, no op can take less than that sum / C of wall time:
  the summary prints it beside the times so a CPU-bound comparison shows as one.
- memcpy_gbps: the per-rank bandwidth of the engine's copy routine (tunedist._C.measure_copy_gbps) while all ranks
  copy at once; the median of each rank, then the mean over ranks. bound: the all_reduce ceiling of a two-shot
  algorithm with copy-in/out, 4(P-1)/(5P+1) x memcpy_gbps, and each backend's busbw over it at the largest size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

import tunedist

DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64, "int32": torch.int32,
          "int64": torch.int64}
TYPE_NAMES = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16", torch.float64: "double",
              torch.int32: "int32", torch.int64: "int64"}  # nccl-tests' spelling
REDOPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
RANK_REDUCTIONS = {0: "rank 0", 1: "average", 2: "min", 3: "max"}
# Inputs repeat with this prime period, so a chunk misplaced by a power-of-two offset shows up as wrong elements.
PERIOD = 17
DEFAULT_WARMUP = 5


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
                   help="comma-separated CPU c10d backends, all measured in this run (default tuned,gloo)")
    p.add_argument("--ops", type=_csv(OPS, "op"), default=list(OPS), help="comma-separated, default all four")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--step-factor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, help="timed calls per point (default: adaptive, see --target-s)")
    p.add_argument("-w", "--warmup", type=int, help=f"warm-up calls per point (default: up to {DEFAULT_WARMUP})")
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
        caps = dist.Backend.backend_capability.get(b.lower())
        if caps is None:
            p.error(f"unknown backend {b!r}: registered are {', '.join(sorted(dist.Backend.backend_capability))}")
        if args.device not in caps:
            p.error(f"backend {b!r} does not serve {args.device} tensors (devices {caps}); see --device")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False here")
    if not 1 <= args.min_bytes <= args.max_bytes or args.step_factor < 2:
        p.error("need 1 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib, which is not installed (pip install matplotlib), or drop --plot")
    return args


def _pattern(rank: int, start: int) -> torch.Tensor:
    """x(r, i) = (3i + 5r) mod 17 + 1 for i = start .. start + 16: one period of rank r's input from index start."""
    return ((torch.arange(PERIOD) + start) * 3 + rank * 5) % PERIOD + 1


def _tile(period: torch.Tensor, n: int, dtype) -> torch.Tensor:
    return period.to(dtype).repeat(n // PERIOD + 1)[:n]


def _reduced(world: int, start: int, redop: str) -> torch.Tensor:
    per_rank = torch.stack([_pattern(r, start) for r in range(world)])
    return {"sum": per_rank.sum(0), "max": per_rank.amax(0), "min": per_rank.amin(0)}[redop]


@dataclass(frozen=True)
class Buffers:
    """One point's tensors: fill() writes this rank's inputs, call() runs the op once, after which `out` must equal
    `expected` on this rank."""

    call: Callable[[], object]
    fill: Callable[[], object]
    out: torch.Tensor
    expected: torch.Tensor


@dataclass(frozen=True)
class Collective:
    """One measured op, as nccl-tests' struct testColl: its name, the variants measured, how S and busbw follow from
    the count and the world size, and its buffers."""

    name: str
    variants: tuple[bool, ...]  # in-place flags measured, out-of-place first
    summary_inplace: bool  # the variant the summary and the plot compare
    reduces: bool  # takes --op (the redop column); the others print "none"
    whole_array: bool  # S = n x count x typesize (the gathered or scattered array), else count x typesize
    busbw_factor: Callable[[int], float]  # busbw = algbw x busbw_factor(n)
    # (rank, world, inplace, count, dtype, redop, group) -> Buffers
    buffers: Callable[[int, int, bool, int, torch.dtype, str, object], Buffers]

    def nbytes(self, count: int, itemsize: int, world: int) -> int:
        return count * itemsize * (world if self.whole_array else 1)


def _own_input(inp, rank: int, n: int, dtype):
    def fill():
        return inp.copy_(_tile(_pattern(rank, 0), n, dtype))
    return fill


def _all_reduce_buffers(rank, world, inplace, count, dtype, redop, group) -> Buffers:
    inp = torch.empty(count, dtype=dtype)
    out = inp if inplace else torch.empty(count, dtype=dtype)
    expected = _tile(_reduced(world, 0, redop), count, dtype)

    def call():
        if not inplace:
            out.copy_(inp)  # torch's all_reduce works in place: out of place is the caller's copy plus that
        dist.all_reduce(out, op=REDOPS[redop], group=group)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _broadcast_buffers(rank, world, inplace, count, dtype, redop, group) -> Buffers:
    inp = torch.empty(count, dtype=dtype)
    out = inp if inplace else torch.empty(count, dtype=dtype)
    expected = _tile(_pattern(0, 0), count, dtype)

    def call():
        dist.broadcast(out, src=0, group=group)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _all_gather_buffers(rank, world, inplace, count, dtype, redop, group) -> Buffers:
    out = torch.empty(world * count, dtype=dtype)
    inp = out.narrow(0, rank * count, count) if inplace else torch.empty(count, dtype=dtype)
    expected = torch.cat([_tile(_pattern(r, 0), count, dtype) for r in range(world)])

    def call():
        dist.all_gather_into_tensor(out, inp, group=group)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _reduce_scatter_buffers(rank, world, inplace, count, dtype, redop, group) -> Buffers:
    inp = torch.empty(world * count, dtype=dtype)
    out = inp.narrow(0, rank * count, count) if inplace else torch.empty(count, dtype=dtype)
    expected = _tile(_reduced(world, rank * count, redop), count, dtype)

    def call():
        dist.reduce_scatter_tensor(out, inp, op=REDOPS[redop], group=group)
    return Buffers(call, _own_input(inp, rank, world * count, dtype), out, expected)


# One record per op, in sweep order. torch's all_reduce and broadcast work in place only (see the docstring).
COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", variants=(False, True), summary_inplace=True, reduces=True, whole_array=False,
               busbw_factor=lambda n: 2 * (n - 1) / n, buffers=_all_reduce_buffers),
    Collective("all_gather", variants=(False, True), summary_inplace=False, reduces=False, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_all_gather_buffers),
    Collective("reduce_scatter", variants=(False, True), summary_inplace=False, reduces=True, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_reduce_scatter_buffers),
    Collective("broadcast", variants=(True,), summary_inplace=True, reduces=False, whole_array=False,
               busbw_factor=lambda n: 1.0, buffers=_broadcast_buffers),
)}
OPS = tuple(COLLECTIVES)
VARIANTS = {name: c.variants for name, c in COLLECTIVES.items()}  # in-place flags measured per op
PRIMARY_INPLACE = {name: c.summary_inplace for name, c in COLLECTIVES.items()}


def count_wrong(bufs: Buffers) -> int:
    """Writes the inputs, calls the op and counts this rank's elements that differ from the closed form."""
    bufs.fill()
    bufs.call()
    return int((bufs.out != bufs.expected).sum())


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


def measure_point(args, backend, group, op, inplace, count) -> dict:
    world, dtype, coll = dist.get_world_size(), DTYPES[args.dtype], COLLECTIVES[op]
    with _device(args):  # buffers and expected values on --device
        bufs = coll.buffers(dist.get_rank(), world, inplace, count, dtype, args.redop, group)
    call = _synchronized(bufs.call) if args.device == "cuda" else bufs.call
    start = time.perf_counter()
    wrong_here = count_wrong(bufs) if args.check else 0
    first_s = time.perf_counter() - start
    n_wrong, first_s = _over_ranks([wrong_here, first_s], 1)  # everyone must agree on the counts below
    n_wrong = round(n_wrong * world)
    warmup = args.warmup if args.warmup is not None else max(1, min(DEFAULT_WARMUP, int(args.target_s / first_s)))
    warm = sorted(_timed(call, warmup))
    (est_s,) = _over_ranks([warm[len(warm) // 2]], 3)
    iters = args.iters or min(args.max_iters, max(args.min_iters, round(args.target_s / max(est_s, 1e-9))))
    cpu0 = time.process_time()
    times = _timed(call, iters)
    cpu_s = (time.process_time() - cpu0) / iters
    mean_s, p50, p99 = _over_ranks([sum(times) / iters] + [_percentile(sorted(times), q) for q in (0.5, 0.99)],
                                   args.average)
    (cpu_mean_s,) = _over_ranks([cpu_s], 1)
    nbytes = coll.nbytes(count, dtype.itemsize, world)
    algbw = nbytes / mean_s / 1e9
    return {"backend": backend, "op": op, "dtype": args.dtype, "redop": args.redop if coll.reduces else "none",
            "bytes": nbytes, "count": count, "inplace": inplace, "iters": iters, "warmup": warmup,
            "time_us": mean_s * 1e6, "p50_us": p50 * 1e6, "p99_us": p99 * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": algbw * coll.busbw_factor(world), "wrong": n_wrong, "cpu_us": cpu_mean_s * 1e6,
            "cpu_all_ranks_us": cpu_mean_s * world * 1e6}


def plan(args, world: int) -> list:
    """(op, count) pairs in sweep order, one per distinct S (small sizes round up to one element per rank)."""
    itemsize, points = DTYPES[args.dtype].itemsize, []
    for op in args.ops:
        per = COLLECTIVES[op].nbytes(1, itemsize, world)
        size, seen = args.min_bytes, set()
        while size <= args.max_bytes:
            count = max(1, size // per)
            if count not in seen:
                seen.add(count)
                points.append((op, count))
            size *= args.step_factor
    return points


def measure_memcpy(args) -> float:
    """Per-rank copy bandwidth (GB/s) with every rank copying at once: median per rank, mean over ranks."""
    nbytes = max(args.memcpy_bytes, args.max_bytes)
    dist.barrier()
    runs = sorted(tunedist._C.measure_copy_gbps(nbytes, 5))
    return _over_ranks([runs[len(runs) // 2]], 1)[0]


class Progress:
    """tqdm on stderr when it is installed, else a plain bar; silent off rank 0."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.bar, self.enabled = total, 0, None, enabled
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm  # noqa: PLC0415
            self.bar = tqdm(total=total, file=sys.stderr, unit="pt", dynamic_ncols=True, leave=False)

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif self.enabled and (sys.stderr.isatty() or self.done == self.total or self.done % 20 == 0):
            filled = 30 * self.done // self.total
            end = "\r" if sys.stderr.isatty() and self.done < self.total else "\n"
            print(f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label:<40}", end=end,
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _half(r) -> str:
    if r is None:
        return f"{'-':>10} {'-':>10} {'-':>10} {'-':>7} {'-':>7} {'-':>6}"
    return (f"{r['time_us']:>10.2f} {r['p50_us']:>10.2f} {r['p99_us']:>10.2f} {r['algbw_gbps']:>7.2f} "
            f"{r['busbw_gbps']:>7.2f} {r['wrong']:>6}")


def print_tables(results, args, meta) -> None:
    print(f"# tunedist.bench: world_size {meta['world_size']}, dtype {args.dtype}, threads "
          f"{meta['threads']['torch_num_threads']}, simd {meta['simd']}, torch {meta['torch']}, time = "
          f"{RANK_REDUCTIONS[args.average]} over ranks, memcpy {meta['memcpy_gbps']:.2f} GB/s per rank")
    half = f"{'time':>10} {'p50':>10} {'p99':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    units = f"{'(us)':>10} {'(us)':>10} {'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
    for backend in args.backends:
        for op in args.ops:
            rows = {}
            for r in results:
                if r["backend"] == backend and r["op"] == op:
                    rows.setdefault((r["bytes"], r["count"]), {})[r["inplace"]] = r
            print(f"#\n# backend {backend}: {op}\n#{'':>45}{'out-of-place':^55}     {'in-place':^55}")
            print(f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6}     {half}     {half}")
            print(f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6}     {units}     {units}")
            for (nbytes, count), pair in rows.items():
                any_r = next(iter(pair.values()))
                print(f"{nbytes:>12} {count:>12} {TYPE_NAMES[DTYPES[args.dtype]]:>8} {any_r['redop']:>6}     "
                      f"{_half(pair.get(False))}     {_half(pair.get(True))}")
    if len(args.backends) > 1:
        print_summary(results, args, meta)


def print_summary(results, args, meta) -> None:
    ref = args.backends[0]
    prim = {(r["backend"], r["op"], r["bytes"]): r for r in results if r["inplace"] == PRIMARY_INPLACE[r["op"]]}
    bound = meta["bound"]["busbw_gbps"]
    for other in args.backends[1:]:
        print(f"#\n# summary: {ref} vs {other} (all_reduce, broadcast in place; all_gather, reduce_scatter out of "
              f"place); speedup = {other} time / {ref} time; all_reduce bound {bound:.2f} GB/s; cpu = CPU time per "
              f"op of all ranks' processes together")
        print(f"#{'size(B)':>11} {'op':>15} {ref + ' us':>12} {other + ' us':>12} {'speedup':>8} "
              f"{ref + ' busbw':>12} {other + ' busbw':>12} {ref + '/bound':>12} {ref + ' cpu us':>13} "
              f"{other + ' cpu us':>13}")
        for (backend, op, nbytes), r in prim.items():
            o = prim.get((other, op, nbytes))
            if backend != ref or o is None:
                continue
            vs_bound = f"{r['busbw_gbps'] / bound:>12.3f}" if op == "all_reduce" and bound else f"{'-':>12}"
            print(f"{nbytes:>12} {op:>15} {r['time_us']:>12.2f} {o['time_us']:>12.2f} "
                  f"{o['time_us'] / r['time_us']:>8.2f} {r['busbw_gbps']:>12.2f} {o['busbw_gbps']:>12.2f} {vs_bound} "
                  f"{r['cpu_all_ranks_us']:>13.1f} {o['cpu_all_ranks_us']:>13.1f}")


def bound_section(results, world: int, memcpy_gbps: float) -> dict:
    factor = 4 * (world - 1) / (5 * world + 1)
    section = {"formula": "4(P-1)/(5P+1) x memcpy_gbps (two-shot all_reduce with copy-in/out)", "factor": factor,
               "busbw_gbps": factor * memcpy_gbps, "largest": {}}
    for r in results:
        if r["op"] == "all_reduce" and r["inplace"]:
            best = section["largest"].get(r["backend"])
            if best is None or r["bytes"] >= best["bytes"]:
                ratio = r["busbw_gbps"] / section["busbw_gbps"] if section["busbw_gbps"] else None
                section["largest"][r["backend"]] = {"bytes": r["bytes"], "busbw_gbps": r["busbw_gbps"],
                                                    "ratio": ratio}
    return section


def plot(results, meta, path: str):
    """The --plot figure (tunedist.bench_plot); returns the matplotlib Figure."""
    from .bench_plot import plot as draw  # noqa: PLC0415  (matplotlib is optional)

    return draw(results, meta, path, PRIMARY_INPLACE)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")  # control traffic only; every measured backend gets a group of its own
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {b: dist.new_group(backend=b) for b in args.backends}
    if args.device == "cuda":
        torch.cuda.set_device(_device(args))
    meta = {"world_size": world, "device": args.device, "memcpy_gbps": measure_memcpy(args),
            "simd": tunedist.simd_level(),
            "torch": torch.__version__, "tunedist": tunedist.version(), "average": RANK_REDUCTIONS[args.average],
            "threads": {"torch_num_threads": torch.get_num_threads(), "requested": args.threads,
                        "torch_num_interop_threads": torch.get_num_interop_threads(),
                        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}}
    points = [(b, op, ip, count) for b in args.backends for op, count in plan(args, world) for ip in VARIANTS[op]]
    progress, results = Progress(len(points), rank == 0 and not args.no_progress), []
    for backend, op, inplace, count in points:
        results.append(measure_point(args, backend, groups[backend], op, inplace, count))
        progress.step(f"{backend} {op} {results[-1]['bytes']} B{' in-place' if inplace else ''}")
    progress.close()
    if "tuned" in groups:  # hosts the tuned group spans (hierarchical collectives over gloo when more than one)
        meta["tuned_hosts"] = tunedist._C.host_layout(groups["tuned"]._get_backend(torch.device("cpu")))
    meta["bound"] = bound_section(results, world, meta["memcpy_gbps"])
    if rank == 0:
        if len(meta.get("tuned_hosts", [])) > 1:
            print(f"# tuned spans {len(meta['tuned_hosts'])} hosts: {meta['tuned_hosts']} (TUNEDIST_HOST_ID)")
        print_tables(results, args, meta)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**meta, "results": results}, f, indent=1)
        if args.plot:
            plot(results, meta, args.plot)
    dist.barrier()
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()
    return 1 if any(r["wrong"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
