"""Probes of how communication and the backward pass share this machine, each timed in pairs (a plain backward,
then one with the probe's communication, in turns) so that a drifting load hits both alike.

- contention: one async all_reduce started with the backward; the share of its time the backward loses.
- per-gradient all_reduce: one async all_reduce per gradient as it is ready (DDP with a bucket per tensor, without
  DDP's bookkeeping); against the cost model, what each bucket costs beyond its all_reduce.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .measure import agree_max, model_bytes, params_of


@dataclass(frozen=True)
class PairedTiming:
    plain_s: float  # backward alone
    compute_s: float  # backward with the probe running (until backward() returns)
    total_s: float  # until the probe's communication has finished too


def _one(module, step_fn, group, start, finish) -> tuple:
    module.zero_grad(set_to_none=True)
    loss = step_fn(module)
    agree_max([0.0], group)  # start together
    t1 = time.perf_counter()
    handle = start() if start is not None else None
    loss.backward()
    t2 = time.perf_counter()
    if finish is not None:
        finish(handle)
    return t2 - t1, time.perf_counter() - t1


def paired_backward(module, step_fn, group, start, finish, iters: int = 3) -> PairedTiming:
    """Medians over `iters` pairs, max over ranks. start() runs just before backward and returns a handle that
    finish(handle) completes after it."""
    plain, compute, total = [], [], []
    try:
        for _ in range(iters):
            plain.append(_one(module, step_fn, group, None, None)[0])
            c, t = _one(module, step_fn, group, start, finish)
            compute.append(c)
            total.append(t)
    finally:
        module.zero_grad(set_to_none=True)
    return PairedTiming(*agree_max([statistics.median(x) for x in (plain, compute, total)], group))


def measure_contention(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> float:
    """(backward with an overlapped all_reduce - backward alone) / that all_reduce's time alone (from the fit
    `comm`), clamped to [0, 1]. The all_reduce is sized to take about half the backward."""
    nbytes = int(min(max(0.5 * backward_s / max(comm.s_per_byte, 1e-15), 4096), 4 * model_bytes(module)))
    buf = torch.zeros(nbytes // 4)
    dist.all_reduce(buf, group=group)  # first touch of the buffer, outside the timing
    t = paired_backward(module, step_fn, group, lambda: dist.all_reduce(buf, group=group, async_op=True),
                        lambda work: work.wait(), iters)
    return min(1.0, max(0.0, (t.compute_s - t.plain_s) / max(comm.time(nbytes), 1e-9)))


def time_per_gradient_all_reduce(module, step_fn, group, iters: int = 3) -> PairedTiming:
    """A backward that all-reduces each gradient the moment it is ready, paired with a plain one. The gradients
    are summed over ranks, then cleared."""
    params = params_of(module)
    works = []

    def start():
        return [p.register_post_accumulate_grad_hook(
            lambda q: works.append(dist.all_reduce(q.grad, group=group, async_op=True))) for p in params]

    def finish(handles):
        for h in handles:
            h.remove()
        for w in works:
            w.wait()
        works.clear()

    return paired_backward(module, step_fn, group, start, finish, iters)
