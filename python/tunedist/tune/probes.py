"""Probes of how communication and the backward pass share this machine, each timed right after a plain backward
(in pairs, or in triples of a plain backward and both probes: measure_probes) so that a drifting load hits all alike.

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


def paired_backward(module, step_fn, group, start, finish, iters: int = 3) -> PairedTiming:
    """Medians over `iters` pairs, max over ranks. start() runs just before backward and returns a handle that
    finish(handle) completes after it."""
    return paired_backwards(module, step_fn, group, [(start, finish)], iters)[0][0]


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


def _contention(t: PairedTiming, alone_s: float) -> float:
    return min(1.0, max(0.0, (t.compute_s - t.plain_s) / max(alone_s, 1e-9)))


def measure_contention(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> float:
    """(backward with an overlapped all_reduce - backward alone) / that all_reduce's time alone (from the fit
    `comm`), clamped to [0, 1]. The all_reduce is sized to take about half the backward."""
    start, finish, nbytes = _contention_probe(module, group, comm, backward_s)
    return _contention(paired_backward(module, step_fn, group, start, finish, iters), comm.time(nbytes))


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
    contention: float
    per_grad: PairedTiming
    tail_s: float  # the tail all_reduce of the model's bytes right after a plain backward


def measure_probes(module, step_fn, group, comm, backward_s: float, iters: int = 3) -> Probes:
    """The fit calibrated by the tail all_reduce, then measure_contention (against the calibrated fit) and
    time_per_gradient_all_reduce, all in one go and sharing their plain backwards (a quarter fewer backwards than
    the two probes apart)."""
    start, finish, nbytes = _contention_probe(module, group, comm, backward_s)
    tail, tail_bytes = _tail_probe(module, group)
    (cont, per_grad), tail_s = paired_backwards(
        module, step_fn, group, [(start, finish), _per_gradient_probe(module, group)], iters, after_plain=tail)
    calibrated = comm.calibrated(tail_bytes, tail_s)
    return Probes(comm=calibrated, contention=_contention(cont, calibrated.time(nbytes)), per_grad=per_grad,
                  tail_s=tail_s)
