"""Probes of how communication and the backward pass share this machine, each timed right after a plain backward
(measure_probes runs them all in turns with the same plain backwards) so that a drifting load hits all alike.

- contention: one async all_reduce started with the backward; the share of its time the backward loses.
- per-gradient all_reduce: one async all_reduce per gradient as it is ready (DDP with a bucket per tensor, without
  DDP's bookkeeping); against the cost model, what each bucket costs beyond its all_reduce.
- tail all_reduce: the model's bytes in one buffer, all-reduced and divided by the world size (DDP's default hook)
  right after a plain backward, as a one-bucket DDP does; it calibrates the all_reduce fit, which was measured on
  warm caches.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .costmodel import CommModel
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


def paired_backwards(module, step_fn, group, probes, iters: int = 3, after_plain=None) -> tuple:
    """(one PairedTiming per (start, finish) of `probes`, seconds of after_plain()): all against the same plain
    backwards. Each iteration runs a plain backward, then after_plain() (timed; 0.0 when None), then a backward
    with each probe in turn, so every probe stays next to a plain one in time and the plain backwards are not
    repeated per probe. Medians over `iters`, max over ranks."""
    plain, after, compute, total = [], [], [[] for _ in probes], [[] for _ in probes]
    try:
        for _ in range(iters):
            plain.append(_one(module, step_fn, group, None, None)[0])
            if after_plain is not None:
                agree_max([0.0], group)  # start together: the wait for a slower rank's backward is not timed
                t0 = time.perf_counter()
                after_plain()
                after.append(time.perf_counter() - t0)
            for k, (start, finish) in enumerate(probes):
                c, t = _one(module, step_fn, group, start, finish)
                compute[k].append(c)
                total[k].append(t)
    finally:
        module.zero_grad(set_to_none=True)
    agreed = agree_max([statistics.median(after) if after else 0.0, statistics.median(plain)] +
                       [statistics.median(x) for k in range(len(probes)) for x in (compute[k], total[k])], group)
    return [PairedTiming(agreed[1], agreed[2 + 2 * k], agreed[3 + 2 * k]) for k in range(len(probes))], agreed[0]


def _contention_probe(module, group, comm, backward_s: float) -> tuple:
    """(start, finish, bytes): one all_reduce sized to take about half the backward by `comm`."""
    nbytes = int(min(max(0.5 * backward_s / max(comm.s_per_byte, 1e-15), 4096), 4 * model_bytes(module)))
    buf = torch.zeros(nbytes // 4)
    dist.all_reduce(buf, group=group)  # first touch of the buffer, outside the timing
    return (lambda: dist.all_reduce(buf, group=group, async_op=True)), (lambda work: work.wait()), nbytes


def _per_gradient_probe(module, group) -> tuple:
    """(start, finish): an all_reduce of each gradient the moment it is ready; finish waits for them all. The
    gradients are summed over ranks (and cleared after by paired_backwards)."""
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


def _tail_probe(module, group):
    """A one-bucket DDP's communication once its backward is done: the model's bytes in one buffer, all-reduced,
    then divided by the world size in the future's callback (DDP's default hook). Returns (run, bytes)."""
    nbytes = max(model_bytes(module) // 4 * 4, 4)
    buf = torch.zeros(nbytes // 4)
    world = dist.get_world_size(group)
    dist.all_reduce(buf, group=group)  # first touch, outside the timing

    def run():
        work = dist.all_reduce(buf, group=group, async_op=True)
        work.get_future().then(lambda fut: fut.value()[0].div_(world)).wait()

    return run, nbytes


@dataclass(frozen=True)
class Probes:
    comm: CommModel  # the all_reduce fit, calibrated by the tail all_reduce (CommModel.calibrated)
    # (backward with an overlapped all_reduce - backward alone) / that all_reduce's time alone by `comm`, in [0, 1]
    contention: float
    per_grad: PairedTiming  # a backward with the per-gradient all_reduces, against a plain one
    tail_s: float  # the tail all_reduce of the model's bytes right after a plain backward


def measure_probes(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> Probes:
    """The three probes in one go, sharing their plain backwards (each iteration: a plain backward, the tail
    all_reduce, a backward with the contention probe, one with the per-gradient probe). The fit `comm` is
    calibrated by the tail all_reduce, and the contention is measured against the calibrated fit."""
    start, finish, nbytes = _contention_probe(module, group, comm, backward_s)
    tail, tail_bytes = _tail_probe(module, group)
    (cont, per_grad), tail_s = paired_backwards(
        module, step_fn, group, [(start, finish), _per_gradient_probe(module, group)], iters, after_plain=tail)
    calibrated = comm.calibrated(tail_bytes, tail_s)
    contention = min(1.0, max(0.0, (cont.compute_s - cont.plain_s) / max(calibrated.time(nbytes), 1e-9)))
    return Probes(comm=calibrated, contention=contention, per_grad=per_grad, tail_s=tail_s)
