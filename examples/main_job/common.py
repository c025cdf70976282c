"""What the main job's three workloads share: how a sample is measured and summarised, the rank reductions, memory.

A sample is one unit of work of one run (a training step, or one decoded token) split the same way in every run:
- total: its wall time on a rank;
- compute: the same unit's computation with no communication at all, timed on the same rank in the same round next
  to it (DDP: the DDP module's forward+backward under no_sync on the same batch; FSDP2: an unsharded local replica
  in the compute dtype on the same batch; tensor-parallel decoding: the same decode step with the all_reduce left
  out);
- optimizer: the optimizer step (0 where there is none);
- exposed communication: total - compute - optimizer, what the collectives added that the compute did not hide (it
  may come out slightly negative for one sample under load; medians are taken as they are).
The ranks of a job wait for each other, so each sample is taken from the rank whose total was the largest.
Summaries are medians with the 10th and 90th percentiles over the samples, never single samples.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

PARTS = ("compute", "comm", "optimizer")


def percentile(values: list, q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between the nearest ranks (numpy's default)."""
    s = sorted(values)
    if not s:
        raise ValueError("percentile of no samples")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: list) -> dict:
    """median, p10, p90 (and p99, n) of a list of samples."""
    return {"median": statistics.median(values), "p10": percentile(values, 0.10), "p90": percentile(values, 0.90),
            "p99": percentile(values, 0.99), "n": len(values)}


@dataclass
class Samples:
    """One run's samples on this rank, in milliseconds; critical() picks each sample's slowest rank."""

    total: list = field(default_factory=list)
    compute: list = field(default_factory=list)
    optimizer: list = field(default_factory=list)

    def add(self, total_s: float, compute_s: float, optimizer_s: float = 0.0) -> None:
        self.total.append(total_s * 1e3)
        self.compute.append(compute_s * 1e3)
        self.optimizer.append(optimizer_s * 1e3)

    def critical(self, group) -> dict:
        """Every rank's samples gathered; for each sample the values of the rank with the largest total."""
        mine = [self.total, self.compute, self.optimizer]
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, mine, group=group)
        n = min(len(r[0]) for r in every)
        total, compute, optimizer = [], [], []
        for i in range(n):
            slowest = max(every, key=lambda r, i=i: r[0][i])
            total.append(slowest[0][i])
            compute.append(slowest[1][i])
            optimizer.append(slowest[2][i])
        comm = [t - c - o for t, c, o in zip(total, compute, optimizer)]
        return {"total_ms": total, "compute_ms": compute, "comm_ms": comm, "optimizer_ms": optimizer}


def breakdown(critical: dict) -> dict:
    """Median and p10/p90 of each part of a run's critical samples."""
    return {part: spread(critical[f"{part}_ms"]) for part in ("total", *PARTS)}


class Timer:
    """perf_counter stopwatch: lap() returns the seconds since the last lap (or the start)."""

    def __init__(self):
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed


def everywhere(flag: bool, group) -> bool:
    """Whether flag holds on every rank."""
    t = torch.tensor([0 if flag else 1], dtype=torch.int64)
    dist.all_reduce(t, group=group)
    return t.item() == 0


def same_on_every_rank(values: list, group) -> bool:
    """Whether every rank holds the same list (of numbers)."""
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, values, group=group)
    return all(v == every[0] for v in every)


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------------------------
# Memory

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def fixed_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Has glibc serve every allocation of nbytes or more with mmap and return it with munmap on free.

    By default glibc raises its mmap threshold as large blocks are freed (up to 32 MiB) and keeps freed blocks
    resident, so a step's RSS would show what earlier steps left behind, not what this step needed. With a fixed
    threshold a tensor's pages are resident exactly while it lives, for both runs alike. Returns False where there is
    no glibc (the peaks are then less exact)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, nbytes))
    except OSError:
        return False


def _status_bytes(*keys: str) -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in keys:
                out[name] = int(value.split()[0]) * 1024
    return out


class PeakRss:
    """The growth of this process's resident memory during a block: VmHWM (the high-water mark, reset by writing 5
    to /proc/self/clear_refs at the start) minus VmRSS at the start. Shared memory a block touches for the first time
    counts (RssShmem); pages already resident do not. `available` is False where clear_refs cannot be written."""

    def __init__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.available = True
        except OSError:
            self.available = False
        self.start = _status_bytes("VmRSS")["VmRSS"] if self.available else 0

    def growth(self) -> int | None:
        if not self.available:
            return None
        return _status_bytes("VmHWM")["VmHWM"] - self.start


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
