"""What the tuner measures on the running job: when each gradient is ready in the backward pass, what an
all_reduce costs at each size on the group's backend, and how long a DDP step takes. Every result is agreed on by
all ranks (reduced over the group), so every rank takes the same decisions from it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


def agree_max(values, group) -> list:
    """The element-wise max over the ranks of `group` (the slowest rank sets the pace of a collective step)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def broadcast_ints(values, group) -> list:
    """Rank 0's integers, on every rank of `group`."""
    t = torch.tensor(values, dtype=torch.int64)
    dist.broadcast(t, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    return t.tolist()


def params_of(module) -> list:
    """The parameters DDP buckets, in its order: module.parameters() that require grad, shared ones once."""
    seen, out = set(), []
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


@dataclass(frozen=True)
class ReadyProfile:
    order: tuple  # parameter indices (params_of order) in gradient-ready order, rank 0's
    # seconds after backward start at which each of `order` is ready: median over iterations, max over ranks
    ready_s: tuple
    param_bytes: tuple  # bytes of each of `order`
    shapes: tuple  # shape of each of `order`
    forward_s: float
    backward_s: float  # backward start to its end (the last hook and the return of backward())

    @property
    def compute_step_s(self) -> float:
        return self.forward_s + self.backward_s


def _one_backward(module, step_fn, params) -> tuple:
    stamps, order = {}, []
    index = {id(p): i for i, p in enumerate(params)}

    def hook(p):
        stamps[index[id(p)]] = time.perf_counter()
        order.append(index[id(p)])

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params]
    try:
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        loss = step_fn(module)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
    finally:
        for h in handles:
            h.remove()
    missing = [i for i in range(len(params)) if i not in stamps]
    if missing:
        raise RuntimeError(f"tunedist.tune: {len(missing)} parameters got no gradient in the measured step (first: "
                           f"index {missing[0]}); DDP needs find_unused_parameters=True for such a model, which the "
                           "tuner does not model. Freeze them (requires_grad=False) or tune a step that uses them")
    return order, [stamps[i] - t1 for i in range(len(params))], t1 - t0, t2 - t1


def measure_ready_times(module, step_fn, group, iters: int = 5, warmup: int = 1) -> ReadyProfile:
    """Runs `step_fn(module)` + backward on the plain module (no DDP) with post-accumulate-grad hooks."""
    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        raise RuntimeError("tunedist.tune needs Tensor.register_post_accumulate_grad_hook (torch >= 2.1)")
    params = params_of(module)
    if not params:
        raise ValueError("tunedist.tune: the model has no parameter that requires grad; nothing to all-reduce")
    runs = [_one_backward(module, step_fn, params) for _ in range(warmup + iters)][warmup:]
    for p in params:
        p.grad = None
    ready = [statistics.median(r[1][i] for r in runs) for i in range(len(params))]
    fwd, bwd = statistics.median(r[2] for r in runs), statistics.median(r[3] for r in runs)
    agreed = agree_max(ready + [fwd, bwd], group)
    order = broadcast_ints(runs[0][0], group)
    if sorted(order) != list(range(len(params))):
        raise RuntimeError("tunedist.tune: rank 0's gradient order does not cover this rank's parameters; the "
                           "ranks' models differ")
    nbytes = [params[i].numel() * params[i].element_size() for i in order]
    return ReadyProfile(order=tuple(order), ready_s=tuple(agreed[i] for i in order), param_bytes=tuple(nbytes),
                        shapes=tuple(tuple(params[i].shape) for i in order),
                        forward_s=agreed[-2], backward_s=agreed[-1])


def comm_sizes(total_bytes: int, smallest: int = 4096, points: int = 7) -> list:
    """Geometric sizes from `smallest` to the whole model (a one-bucket step all-reduces all of it)."""
    largest = max(total_bytes, smallest * 4)
    ratio = (largest / smallest) ** (1 / (points - 1))
    sizes = sorted({int(smallest * ratio**k) // 4 * 4 for k in range(points)})
    return [s for s in sizes if s > 0]


def time_all_reduce(sizes, group, target_s: float = 0.05, max_reps: int = 50) -> list:
    """Median seconds of an all_reduce of each size (float32), max over ranks. Ranks agree on the repetitions."""
    buf = torch.zeros(max(sizes) // 4 + 1)
    for nbytes in (min(sizes),) * 5 + (max(sizes),) * 2:  # first calls set the group up and fault pages in
        dist.all_reduce(buf.narrow(0, 0, max(nbytes // 4, 1)), group=group)
    out = []
    for nbytes in sizes:
        view = buf.narrow(0, 0, max(nbytes // 4, 1))
        t0 = time.perf_counter()
        dist.all_reduce(view, group=group)  # warm-up, and a first estimate of the time
        (first,) = agree_max([time.perf_counter() - t0], group)
        reps = int(min(max_reps, max(3, target_s / max(first, 1e-6))))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dist.all_reduce(view, group=group)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return agree_max(out, group)


@dataclass(frozen=True)
class StepTiming:
    median_s: float
    spread_s: float  # half the interquartile range
    steps: int
    # Median over rounds of this step over the mean step of the round (all DDPs measured in turns with it): the
    # load's drift from round to round cancels, so it compares DDPs measured together more surely than median_s.
    relative: float = 1.0
    relative_sd: float = 0.0  # standard deviation over rounds of that ratio

    def as_dict(self) -> dict:
        return {"median_ms": self.median_s * 1e3, "spread_ms": self.spread_s * 1e3, "steps": self.steps,
                "relative": self.relative, "relative_sd": self.relative_sd}


def time_steps_interleaved(ddps, step_fn, group, steps: int, warmup: int = 2, on_round=None) -> list:
    """Step times of several DDP wrappers of one module, taken in turns: round k runs one forward + backward of
    each (starting at a different one each round, for 3 or more), so a load that drifts during the measurement hits
    all alike.

    DDPs of one module can coexist: a reducer acts on a backward only when its own forward prepared it. The first
    `warmup` steps of each are not timed (the reducer rebuilds its buckets at the second forward). Returns one
    StepTiming per DDP; median, spread, relative and its deviation are per rank, then max over ranks.
    """
    for ddp in ddps:
        for _ in range(warmup):
            ddp.zero_grad(set_to_none=True)
            step_fn(ddp).backward()
    samples = [[] for _ in ddps]
    n = len(ddps)
    for k in range(steps):
        for j in range(n):
            # Round k starts at DDP k: no DDP runs twice in a row, except that with 2 a rotation would (A B, B A):
            # a DDP's second step in a row finds its buckets in cache, which flatters one that exposes its
            # communication (4.7% for a one-bucket DDP here, within about one standard error), so 2 alternate.
            i = (j + (k if n > 2 else 0)) % n
            ddps[i].zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            step_fn(ddps[i]).backward()
            samples[i].append(time.perf_counter() - t0)
        if on_round is not None:
            on_round(k)
    for ddp in ddps:
        ddp.zero_grad(set_to_none=True)
    round_mean = [statistics.fmean(s[k] for s in samples) for k in range(steps)]
    local = []
    for s in samples:
        qs = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
        rel = [t / m for t, m in zip(s, round_mean)]
        local += [statistics.median(s), (qs[2] - qs[0]) / 2, statistics.median(rel),
                  statistics.stdev(rel) if len(rel) >= 2 else 0.0]
    agreed = agree_max(local, group)
    return [StepTiming(median_s=agreed[4 * i], spread_s=agreed[4 * i + 1], steps=steps, relative=agreed[4 * i + 2],
                       relative_sd=agreed[4 * i + 3]) for i in range(len(ddps))]


def model_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in params_of(module))
