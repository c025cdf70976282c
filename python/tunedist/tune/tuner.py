"""The tuning procedure: profile, fit, predict every candidate, measure the few best for real, agree on one."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
import weakref
from dataclasses import dataclass

import torch.distributed as dist

from ..bench.report import Progress
from .candidates import HOOKS, Candidate, build_ddp, dispose_ddp, make_candidates, register_hook
from .costmodel import MachineModel, fit_comm_model, simulate
from .measure import (
    broadcast_ints,
    comm_sizes,
    measure_ready_times,
    model_bytes,
    time_all_reduce,
    time_steps_interleaved,
)
from .probes import measure_probes
from .report import Row, TuneReport, hook_advice, predict


@dataclass
class TuneOptions:
    """Knobs of the search. candidates None: caps from 1/64 of the model up to all of it (see make_candidates),
    plus each with a first bucket of first_bucket_mb where the running torch allows it."""

    candidates: list | None = None
    first_bucket_mb: tuple = (1.0,)
    top_k: int = 2  # candidates measured for real: the best prediction, then hedges (see select_trials)
    # A trial overrules the best prediction only when it measured faster by more than this many standard errors of
    # the difference (see choose_trial); 0: the least measured wins, however slightly.
    overrule_sigmas: float = 1.0
    # How much two candidates' relative steps move apart from one measurement window to the next beyond what the
    # window's own rounds show: a shared machine's load changes its mix, and candidates react to it differently
    # (one bucket, all communication exposed, gains most from a quiet moment). On a shared 2-vCPU AMD EPYC, 2 MB
    # against 16 MB over windows of 8 rounds: 0.08-0.12 in all, of which the rounds explain 0.04-0.05. Part of
    # choose_trial's standard error; a dedicated machine can lower it.
    window_sd: float = 0.08
    measure_default: bool = True  # also measure DDP's default, for the report
    trial_steps: int = 8  # timed steps per candidate
    interleave: int = 16  # DDPs alive and measured in turns at once (each holds its own bucket buffers)
    warmup_steps: int = 2  # >= 2: the reducer rebuilds its buckets at the second forward
    profile_iters: int = 3
    probe_pairs: int = 2  # (plain, contention probe, per-gradient probe) backward triples
    comm_points: int = 7
    # Seconds of repeated all_reduces per size of the fit (at least 3 calls each). The calibration by the tail
    # all_reduce sets the bandwidth term a DDP step meets, so the fit mostly pins the latency: 20 ms per size does.
    comm_target_s: float = 0.02
    progress: bool = True  # a bar on rank 0's stderr over the trials


def resolve_step_fn(step_fn, loss_fn, batch):
    """step_fn(model) -> scalar loss (forward only; the tuner runs backward), or loss_fn(model(x), y) of batch."""
    if step_fn is not None:
        if loss_fn is not None or batch is not None:
            raise ValueError("tunedist.tune: pass either step_fn or loss_fn and batch, not both")
        return step_fn
    if loss_fn is None or batch is None:
        raise ValueError("tunedist.tune: pass step_fn(model) -> loss, or loss_fn(output, target) with "
                         "batch=(inputs, target)")
    inputs, target = batch
    return lambda model: loss_fn(model(inputs), target)


def _build_all(module, candidates, group, hook, ddp_kwargs) -> list:
    ddps = []
    try:
        for c in candidates:
            ddps.append(build_ddp(module, c, group, **ddp_kwargs))
            if hook is not None:
                register_hook(ddps[-1], hook, group)
    except BaseException:
        _dispose_all(ddps)
        raise
    return ddps


def _dispose_all(ddps) -> None:
    """Disposes of the trial DDPs and empties `ddps`. Each should be freed (its bucket buffers with it) when the
    list lets go of it; a full gc.collect() (0.1-0.3 s with torch loaded) runs only if one is still
    alive then, held in a reference cycle (a comm hook's state, a traceback)."""
    refs = [weakref.ref(ddps[i]) for i in range(len(ddps))]
    for i in range(len(ddps)):
        dispose_ddp(ddps[i])
    ddps.clear()
    if any(r() is not None for r in refs):
        gc.collect()


def measure_candidates(module, candidates, step_fn, group=None, hook=None, options=None, **ddp_kwargs) -> list:
    """StepTiming of a DDP of `module` with each candidate (also the benchmark's sweep). Up to
    options.interleave DDPs are alive at once and measured in turns (see time_steps_interleaved)."""
    opts = options or TuneOptions()
    chunk = max(1, opts.interleave)
    rank = dist.get_rank(group)
    progress = Progress(opts.trial_steps * -(-len(candidates) // chunk), opts.progress and rank == 0)
    out = []
    for start in range(0, len(candidates), chunk):
        part = candidates[start:start + chunk]
        ddps = _build_all(module, part, group, hook, ddp_kwargs)
        try:
            label = f"candidates {start + 1}-{start + len(part)} of {len(candidates)}"
            out += time_steps_interleaved(ddps, step_fn, group, opts.trial_steps, opts.warmup_steps,
                                          on_round=lambda k, lb=label: progress.step(lb))
        finally:
            _dispose_all(ddps)
    progress.close()
    return out


def rank_key(prediction, candidate) -> tuple:
    """Best prediction first; among equals the larger cap (fewer collectives when the prediction cannot tell)."""
    return round(prediction.step_s, 6), -(candidate.cap_mb or 0)


def select_trials(rows, profile, machine, hook, top_k: int) -> list:
    """The rows to measure for real, `top_k` of them (rows: best prediction first, DDP's default excluded).

    The contention probe is the model's least certain input (one short probe on a shared machine), and it decides
    how much overlapping communication with the backward is worth, which is what separates small buckets (overlap)
    from large ones (fewer collectives). So after the best prediction come the best predictions at the two
    extremes, contention 1 (overlap buys nothing) and 0 (it is free), then the next best as predicted; a candidate
    whose buckets have the same sizes as one already picked is skipped (it would measure the same DDP twice)."""
    def best_at(contention):
        extreme = dataclasses.replace(machine, contention=contention)
        return min(rows, key=lambda r: rank_key(predict(profile, extreme, r.candidate, hook), r.candidate))

    if not rows:
        return []
    picked, layouts = [], set()
    for row in [rows[0], best_at(1.0), best_at(0.0), *rows[1:]]:
        if len(picked) < top_k and row.prediction.bucket_bytes not in layouts:
            picked.append(row)
            layouts.add(row.prediction.bucket_bytes)
    return picked


def measure_machine(model, step_fn, group, profile, opts) -> MachineModel:
    """The all_reduce fit, calibrated by an all_reduce of the model's bytes right after a backward (what a DDP
    bucket meets); then the contention probe and each bucket's fixed cost, from one backward with an all_reduce per
    gradient against what the fit and the contention predict for it (the probes in turns with the same plain
    backwards)."""
    sizes = comm_sizes(model_bytes(model), points=opts.comm_points)
    fit = fit_comm_model(sizes, time_all_reduce(sizes, group, target_s=opts.comm_target_s))
    probes = measure_probes(model, step_fn, group, fit, profile.backward_s, iters=opts.probe_pairs)
    comm, contention, per_grad = probes.comm, probes.contention, probes.per_grad
    scale = per_grad.plain_s / profile.backward_s  # the load now against the load during the profile
    no_overhead = simulate([t * scale for t in profile.ready_s], profile.param_bytes, [1], comm, per_grad.plain_s,
                           per_grad.plain_s, contention=contention)
    overhead = max(0.0, (per_grad.total_s - no_overhead.step_s) / len(profile.param_bytes))
    return MachineModel(comm=comm, contention=contention, bucket_overhead_s=overhead)


def choose_trial(trials, together: bool, sigmas: float, window_sd: float = 0.0) -> int:
    """Index into `trials` (measured rows, trials[0] the best prediction) of the choice.

    The least measured wins only if it beat trials[0] by more than `sigmas` standard errors of the difference;
    otherwise trials[0] stays. A few timed steps of each on a shared machine leave an error of several percent,
    about what separates the best few caps, so a bare minimum follows the noise as often as the truth: the trials
    are there to catch a prediction that is clearly wrong, not to overrule it by chance. The standard error is the
    rounds' own (measured together, in turns in one go: `relative` and its deviation over rounds; apart: the median
    step and its spread, half the interquartile range, 0.674 deviations of a normal) and `window_sd` (a share of
    the step: see TuneOptions) beside it."""
    def value(t):
        return t.relative if together else t.median_s

    def deviation(t):
        return t.relative_sd if together else t.spread_s / 0.674

    least = min(range(len(trials)), key=lambda i: value(trials[i].measured))
    ref, best = trials[0].measured, trials[least].measured
    rounds_se2 = (deviation(ref) ** 2 + deviation(best) ** 2) / max(1, min(ref.steps, best.steps))
    window = window_sd * (1.0 if together else ref.median_s)
    return least if value(ref) - value(best) > sigmas * math.sqrt(rounds_se2 + window ** 2) else 0


def tune(model, step_fn=None, *, loss_fn=None, batch=None, process_group=None, hook=None, options=None,
         **ddp_kwargs) -> TuneReport:
    """Chooses DDP bucket limits for `model` on `process_group` (default: the world). Every rank must call it with
    the same arguments; every rank gets the same choice (rank 0's). `model` must not be wrapped in DDP yet."""
    if hook is not None and hook not in HOOKS:
        raise ValueError(f"tunedist.tune: unknown hook {hook!r}; choose one of {', '.join(HOOKS)} or None")
    if not dist.is_initialized():
        raise RuntimeError("tunedist.tune: call dist.init_process_group first; the tuner measures the group's "
                           "all_reduce and DDP steps")
    opts = options or TuneOptions()
    step_fn = resolve_step_fn(step_fn, loss_fn, batch)
    started = time.perf_counter()
    profile = measure_ready_times(model, step_fn, process_group, iters=opts.profile_iters)
    machine = measure_machine(model, step_fn, process_group, profile, opts)
    candidates = [c for c in (opts.candidates or make_candidates(model_bytes(model), first_mb=opts.first_bucket_mb))
                  if not c.is_default]
    unsupported = [c.label for c in candidates if not c.supported()]
    if unsupported:
        raise ValueError(f"tunedist.tune: this torch cannot set a first bucket apart from the cap for {unsupported}")
    rows = [Row(c, predict(profile, machine, c, hook)) for c in candidates]
    rows.sort(key=lambda r: rank_key(r.prediction, r.candidate))
    rows.append(Row(Candidate(None), predict(profile, machine, Candidate(None), hook)))
    trial_rows = select_trials(rows[:-1], profile, machine, hook, opts.top_k) + \
        ([rows[-1]] if opts.measure_default else [])
    timings = measure_candidates(model, [r.candidate for r in trial_rows], step_fn, process_group, hook, opts,
                                 **ddp_kwargs)
    for r, t in zip(trial_rows, timings):
        r.measured = t
    # Measured in turns in one go, the trials compare best by their step relative to the round's.
    together = len(trial_rows) <= max(1, opts.interleave)
    best = choose_trial(trial_rows, together, opts.overrule_sigmas, opts.window_sd)
    (best,) = broadcast_ints([best], process_group)  # timings are agreed already; rank 0's word settles ties
    group = process_group if process_group is not None else dist.group.WORLD
    report = TuneReport(choice=trial_rows[best].candidate, rows=rows, machine=machine, profile=profile,
                        world_size=dist.get_world_size(group), backend=str(dist.get_backend(group)), hook=hook)
    report.advice = [] if hook else hook_advice(profile, machine, report.choice, trial_rows[best].measured.median_s)
    report.tune_s = time.perf_counter() - started
    return report


def ddp(model, step_fn=None, *, loss_fn=None, batch=None, process_group=None, hook=None, options=None,
        **ddp_kwargs):
    """Tunes the buckets, then returns (DistributedDataParallel(model, <chosen buckets>, **ddp_kwargs) with `hook`
    registered if given, report). hook: None, "fp16", "bf16" or "powersgd" (tunedist.hooks when installed, else
    torch's equivalent)."""
    report = tune(model, step_fn, loss_fn=loss_fn, batch=batch, process_group=process_group, hook=hook,
                  options=options, **ddp_kwargs)
    model_ddp = build_ddp(model, report.choice, process_group, **ddp_kwargs)
    if hook is not None:
        report.hook_used = register_hook(model_ddp, hook, process_group)
    return model_ddp, report
