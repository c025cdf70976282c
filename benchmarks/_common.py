"""What the research tools in benchmarks/ share: sizes on the command line, timing, percentiles and spreads, values
combined over ranks, the process group of a run, and the metadata of its record.

It needs torch only. Nothing of tunedist is imported here (run_meta() looks up the build that the tool imported, and
leaves out what an older build lacks), because bench_ab_builds.py runs against older builds of tunedist, which have
none of today's modules. The tools import it as `_common`: a script's own folder is first on sys.path when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time

import torch
import torch.distributed as dist

SIZE_SHIFTS = {"": 0, "k": 10, "m": 20, "g": 30}  # binary units: 1K = 1024


def parse_size(text: str) -> int:
    """Bytes from 8, 4K, 64KiB, 2MB, 256M or 1G (any case; K, M and G are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes such as 8, 4K, 64KiB, 256M, 1G")
    return int(m.group(1)) << SIZE_SHIFTS[m.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of parse_size() sizes, for --sizes."""
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"no size in {text!r}: use bytes such as 4K,64K,1M")
    return sizes


def per_call_us(call, iters: int) -> float:
    """The median of `iters` calls, each timed on its own, in µs."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def loop_mean_s(call, iters: int) -> float:
    """Seconds per call of a loop of `iters` back-to-back calls (total / iters), so that a rank which runs ahead of
    its peers between calls, as a broadcast root can, does not flatter the loop."""
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) / iters


def percentile(values, q: float) -> float:
    """The value at rank round(q x n) of the n sorted values (at least the first, at most the last)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def spread(values, prefix: str = "") -> dict:
    """{prefix + "median", prefix + "min", prefix + "max"} of `values`."""
    return {f"{prefix}median": statistics.median(values), f"{prefix}min": min(values), f"{prefix}max": max(values)}


def over_ranks(values, op=dist.ReduceOp.SUM, mean: bool = False) -> list[float]:
    """This rank's `values`, each combined over the default group's ranks by `op` (mean: the sum over the world
    size). Every rank gets the result."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    if mean:
        t /= dist.get_world_size()
    return t.tolist()


def ranks_failing(ok: bool) -> int:
    """How many ranks of the default group passed ok=False (each passes its own verdict)."""
    return round(over_ranks([0.0 if ok else 1.0])[0])


@contextlib.contextmanager
def process_group(backend: str, threads: int | None = 1):
    """torch.set_num_threads(threads) (None: left as it is), then the default group on `backend` for the block, which
    gets (rank, world size). When the block ends normally, a barrier (no rank tears down while a peer still uses the
    group) and the group's destruction."""
    if threads is not None:
        torch.set_num_threads(threads)
    dist.init_process_group(backend)
    yield dist.get_rank(), dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()


def load_avg() -> list[float]:
    """os.getloadavg() over 1, 5 and 15 minutes, to the two decimals the kernel keeps."""
    return [round(x, 2) for x in os.getloadavg()]


def run_meta() -> dict:
    """What a record needs to be read later: the world size (when a group is up), torch's version, and the tunedist
    build the tool imported (its version and SIMD level where the build has them, and its file)."""
    meta = {"world_size": dist.get_world_size()} if dist.is_initialized() else {}
    meta["torch"] = torch.__version__
    tunedist = sys.modules.get("tunedist")
    if tunedist is not None:
        for key, call in (("tunedist", "version"), ("simd", "simd_level")):
            if hasattr(tunedist, call):
                meta[key] = getattr(tunedist, call)()
        meta["tunedist_file"] = tunedist.__file__
    return meta


def write_json(path: str, record: dict) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
