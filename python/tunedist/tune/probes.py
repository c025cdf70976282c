"""Probes of how communication and the backward pass share this machine, each timed right after a plain backward
(in pairs, or in triples of a plain backward and both probes: measure_probes) so that a drifting load hits all alike.

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
    return paired_backwards(module, step_fn, group, [(start, finish)], iters)[0]


def paired_backwards(module, step_fn, group, probes, iters: int = 3) -> list:
    """One PairedTiming per (start, finish) of `probes`, all against the same plain backwards: each iteration runs
    a plain backward, then one with each probe in turn (so every probe stays next to a plain one in time, and the
    plain backwards are not repeated per probe). Medians over `iters`, max over ranks."""
    plain, compute, total = [], [[] for _ in probes], [[] for _ in probes]
    try:
        for _ in range(iters):
            plain.append(_one(module, step_fn, group, None, None)[0])
            for k, (start, finish) in enumerate(probes):
                c, t = _one(module, step_fn, group, start, finish)
                compute[k].append(c)
                total[k].append(t)
    finally:
        module.zero_grad(set_to_none=True)
    agreed = agree_max([statistics.median(plain)] + [statistics.median(x) for k in range(len(probes))
                                                     for x in (compute[k], total[k])], group)
    return [PairedTiming(agreed[0], agreed[1 + 2 * k], agreed[2 + 2 * k]) for k in range(len(probes))]


def _contention_probe(module, group, comm, backward_s: float) -> tuple:
    """(start, finish, seconds of the all_reduce alone): one all_reduce sized to take about half the backward."""
    nbytes = int(min(max(0.5 * backward_s / max(comm.s_per_byte, 1e-15), 4096), 4 * model_bytes(module)))
    buf = torch.zeros(nbytes // 4)
    dist.all_reduce(buf, group=group)  # first touch of the buffer, outside the timing
    return (lambda: dist.all_reduce(buf, group=group, async_op=True)), (lambda work: work.wait()), comm.time(nbytes)


def _contention(t: PairedTiming, alone_s: float) -> float:
    return min(1.0, max(0.0, (t.compute_s - t.plain_s) / max(alone_s, 1e-9)))


def measure_contention(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> float:
    """(backward with an overlapped all_reduce - backward alone) / that all_reduce's time alone (from the fit
    `comm`), clamped to [0, 1]. The all_reduce is sized to take about half the backward."""
    start, finish, alone_s = _contention_probe(module, group, comm, backward_s)
    return _contention(paired_backward(module, step_fn, group, start, finish, iters), alone_s)


def _per_gradient_probe(module, group) -> tuple:
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

    return start, finish


def time_per_gradient_all_reduce(module, step_fn, group, iters: int = 3) -> PairedTiming:
    """A backward that all-reduces each gradient the moment it is ready, paired with a plain one. The gradients
    are summed over ranks, then cleared."""
    return paired_backward(module, step_fn, group, *_per_gradient_probe(module, group), iters)


def measure_probes(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> tuple:
    """(contention, per-gradient PairedTiming): measure_contention and time_per_gradient_all_reduce in one go,
    sharing their plain backwards (a quarter fewer backwards than the two apart)."""
    start, finish, alone_s = _contention_probe(module, group, comm, backward_s)
    cont, per_grad = paired_backwards(module, step_fn, group, [(start, finish), _per_gradient_probe(module, group)],
                                      iters)
    return _contention(cont, alone_s), per_grad
