"""tunedist.doctor.check: the run-time checks on the user's model, loader and optimizer.

    report = tunedist.doctor.check(ddp_model, loader, optimizer)             # times forward/backward
    report = tunedist.doctor.check(ddp_model, loader, optimizer, step=train_step)  # times your own step(batch)

Every rank of the job calls it at the same point (a DDP model all-reduces in the measured steps). It takes
``warmup + steps`` batches from a fresh iterator of ``loader`` and, for each, times the fetch (``next()``) and the
step; the warm-up batches (worker start-up, first-call allocations) are not counted.

- With ``step``: ``step(batch)`` is one full training step of yours (it moves the batch, runs forward, backward and
  the optimizer), so the measured steps train the model for real.
- Without: ``loss_fn(model, batch)`` (default: the mean of the model's output on the batch's first tensor) then
  ``backward()``; the gradients are dropped afterwards and the ones the parameters had are put back, so the model
  and optimizer are unchanged.

Detectors (each a Finding; thresholds in RuntimeOptions):

- ``loader.sampler``: world size > 1 and neither ``loader.sampler`` nor its batch sampler's sampler is a
  DistributedSampler (warn: every rank trains on the same batches); a DistributedSampler whose num_replicas/rank
  disagree with the group (fail).
- ``loader.num_workers``: ``num_workers == 0`` (warn: batches are loaded between steps, never during them).
- ``loader.fetch_time``: mean time blocked in ``next(loader)`` > ``fetch_share`` (10%) of the mean step time (warn).
- ``batch.per_device``: the first tensor of the batch has fewer than ``min_batch_per_device`` (16) rows (warn).
- ``gpu.precision``: on a GPU, every floating parameter is fp32 and autocast was off in the model's forward during
  the measured steps (seen by a forward pre-hook) (warn).
- ``optimizer.params``: the optimizer holds parameters that are not the (DDP) model's (fail: they get no gradient
  from it), or trainable model parameters that the optimizer lacks (warn).
- ``loader.pin_memory``: on a GPU, ``pin_memory=False`` (warn).

"On a GPU" means the model's parameters are on CUDA; ``gpu=`` overrides that decision (tests). Off a GPU the
GPU-only checks report "skipped: no GPU".
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from ..nccl_env import Finding
from .report import Report, skipped
from .static import Machine, model_device_type, static_findings


@dataclass
class RuntimeOptions:
    steps: int = 5  # measured steps
    warmup: int = 1  # steps run first and not counted
    fetch_share: float = 0.10  # loader.fetch_time warns when the fetch takes more than this share of a step
    min_batch_per_device: int = 16


@dataclass
class Timing:
    fetch_s: list[float]
    step_s: list[float]
    batch_size: int | None  # rows of the first tensor of the first batch
    autocast: list[bool]  # torch.is_autocast_enabled(<model's device>) at each forward of the model

    @property
    def fetch_mean(self) -> float:
        return statistics.fmean(self.fetch_s)

    @property
    def step_mean(self) -> float:
        return statistics.fmean(self.step_s)


def first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The mean of the model's (first) output on the batch's first tensor: a stand-in loss with a full backward."""
    inputs = first_tensor(batch)
    if inputs is None:
        raise TypeError(f"tunedist.doctor.check: the batch ({type(batch).__name__}) holds no tensor; pass "
                        "loss_fn=(model, batch) -> loss or step=(batch) -> None")
    out = first_tensor(model(inputs))
    if out is None:
        raise TypeError("tunedist.doctor.check: the model's output holds no tensor; pass loss_fn or step")
    return out.float().mean()


def _forward_backward(model: torch.nn.Module, loss_fn: Callable | None) -> Callable[[Any], None]:
    device = next(model.parameters()).device

    def run(batch: Any) -> None:
        loss = (loss_fn or default_loss)(model, _to_device(batch, device))
        loss.backward()

    return run


def measure(model: torch.nn.Module, loader, run_step: Callable[[Any], None], options: RuntimeOptions) -> Timing:
    """Times fetch and step for warmup + steps batches; records autocast at each forward of the model."""
    dev = model_device_type(model) or "cpu"
    autocast: list[bool] = []
    handle = model.register_forward_pre_hook(lambda *_: autocast.append(torch.is_autocast_enabled(dev)))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    fetch, step, rows = [], [], None
    it = iter(loader)
    try:
        for i in range(options.warmup + options.steps):
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                raise ValueError(f"tunedist.doctor.check: the loader yielded {i} batches; the check needs "
                                 f"warmup + steps = {options.warmup + options.steps}") from None
            t1 = time.perf_counter()
            run_step(batch)
            sync()
            t2 = time.perf_counter()
            if rows is None:
                t = first_tensor(batch)
                rows = int(t.shape[0]) if t is not None and t.dim() > 0 else None
            if i >= options.warmup:
                fetch.append(t1 - t0)
                step.append(t2 - t1)
    finally:
        handle.remove()
        del it  # shuts the loader's workers down
    return Timing(fetch, step, rows, autocast)


def _world(group, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(world size, rank) of the group if one is initialised, else from WORLD_SIZE and RANK."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group), dist.get_rank(group)
    env = os.environ if env is None else env
    return int(env.get("WORLD_SIZE", "1") or 1), int(env.get("RANK", "0") or 0)


def check_sampler(loader: DataLoader, group=None, env: Mapping[str, str] | None = None) -> Finding:
    check = "loader.sampler"
    world, rank = _world(group, env)
    if isinstance(loader.dataset, IterableDataset):
        return skipped(check, "an IterableDataset has no sampler: it must shard itself by rank")
    if world == 1:
        return Finding(check, "ok", f"world size 1: {type(loader.sampler).__name__} is fine")
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    ds = next((s for s in samplers if isinstance(s, DistributedSampler)), None)
    if ds is None:
        return Finding(check, "warn", f"world size {world} but the sampler is {type(loader.sampler).__name__}: every "
                       f"rank reads the whole dataset, so {world} ranks train on the same batches",
                       "DataLoader(dataset, sampler=DistributedSampler(dataset), ...) and sampler.set_epoch(epoch) "
                       "at each epoch")
    if ds.num_replicas != world or ds.rank != rank:
        return Finding(check, "fail", f"DistributedSampler(num_replicas={ds.num_replicas}, rank={ds.rank}) on rank "
                       f"{rank} of {world}: shards overlap or are skipped",
                       "create the DistributedSampler after init_process_group, without num_replicas/rank")
    return Finding(check, "ok", f"DistributedSampler over {world} ranks")


def check_workers(loader: DataLoader) -> Finding:
    if loader.num_workers == 0:
        return Finding("loader.num_workers", "warn", "num_workers=0: the training process loads each batch "
                       "between steps, so loading never overlaps compute",
                       "DataLoader(..., num_workers=N, persistent_workers=True) with N from 2 up to the cores per "
                       "rank")
    return Finding("loader.num_workers", "ok", f"num_workers={loader.num_workers}")


def check_fetch_time(t: Timing, share: float) -> Finding:
    shown = (f"fetch {t.fetch_mean * 1e3:.2f} ms vs step {t.step_mean * 1e3:.2f} ms per batch "
             f"({t.fetch_mean / t.step_mean:.0%}; limit {share:.0%}) over {len(t.step_s)} steps")
    if t.fetch_mean > share * t.step_mean:
        return Finding("loader.fetch_time", "warn", shown + ": the step waits for data",
                       "more num_workers, prefetch_factor, pin_memory; move decoding/augmentation off the hot path")
    return Finding("loader.fetch_time", "ok", shown)


def check_batch(t: Timing, minimum: int) -> Finding:
    check = "batch.per_device"
    if t.batch_size is None:
        return skipped(check, "the batch holds no tensor with a batch dimension")
    if t.batch_size < minimum:
        return Finding(check, "warn", f"{t.batch_size} samples per device (< {minimum}): fixed per-step costs "
                       "(kernel launches, the gradient all-reduce) dominate",
                       "raise batch_size (scale the LR with tunedist.doctor.scaled_lr), or accumulate gradients "
                       "over micro-batches inside DDP's no_sync()")
    return Finding(check, "ok", f"{t.batch_size} samples per device")


def check_precision(model: torch.nn.Module, t: Timing, gpu: bool) -> Finding:
    check = "gpu.precision"
    if not gpu:
        return skipped(check, "no GPU")
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.is_floating_point()})
    if not t.autocast:
        return skipped(check, "the measured step never called the model's forward")
    used = any(t.autocast)
    if dtypes == ["float32"] and not used:
        return Finding(check, "warn", "parameters float32 and autocast off in the measured forward passes: matmuls "
                       "run in fp32 instead of on the bf16/fp16 tensor cores",
                       "wrap forward and loss in torch.autocast('cuda', dtype=torch.bfloat16) (fp16 also needs "
                       "torch.amp.GradScaler)")
    return Finding(check, "ok", f"parameters {', '.join(dtypes) or 'none'}; autocast "
                   f"{'on' if used else 'off'} in the forward")


def check_optimizer(model: torch.nn.Module, optimizer) -> Finding:
    check = "optimizer.params"
    if optimizer is None:
        return skipped(check, "no optimizer given")
    mine = {id(p) for p in model.parameters()}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = [p for p in held if id(p) not in mine]
    if foreign:
        shapes = ", ".join(str(tuple(p.shape)) for p in foreign[:4]) + (" ..." if len(foreign) > 4 else "")
        return Finding(check, "fail", f"{len(foreign)} of the optimizer's {len(held)} parameters are not the model's "
                       f"({shapes}): they get no gradient from it, and optimizer.step() does not update the model",
                       "build the optimizer from the parameters of the model you train: "
                       "optimizer = SGD(ddp_model.parameters(), ...) after moving and wrapping the model")
    held_ids = {id(p) for p in held}
    left = [p for p in model.parameters() if p.requires_grad and id(p) not in held_ids]
    if left:
        return Finding(check, "warn", f"{len(left)} trainable model parameters are not in the optimizer: they get "
                       "gradients (and all-reduce traffic) but are never updated",
                       "give the optimizer all of model.parameters(), or set requires_grad=False on frozen ones")
    return Finding(check, "ok", f"the optimizer holds {len(held)} of the model's parameters")


def check_pin_memory(loader: DataLoader, gpu: bool) -> Finding:
    if not gpu:
        return skipped("loader.pin_memory", "no GPU")
    if not loader.pin_memory:
        return Finding("loader.pin_memory", "warn", "pin_memory=False: host-to-GPU copies come from pageable memory, "
                       "staged and synchronous", "DataLoader(..., pin_memory=True) and batch.to(device, "
                       "non_blocking=True)")
    return Finding("loader.pin_memory", "ok", "pin_memory=True")


def check(model: torch.nn.Module, loader: DataLoader, optimizer=None, *, step: Callable[[Any], None] | None = None,
          loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None, group=None, gpu: bool | None = None,
          options: RuntimeOptions | None = None, machine: Machine | None = None, include_static: bool = True,
          show: bool = True) -> Report:
    """Measure a few steps of this job and run every run-time (and, by default, static) check on it.

    Collective: every rank calls it. Returns the Report; ``show`` prints its table on rank 0.
    """
    options = options or RuntimeOptions()
    if options.steps < 1 or options.warmup < 0:
        raise ValueError(f"tunedist.doctor.check: steps must be >= 1 and warmup >= 0, got {options}")
    if next(model.parameters(), None) is None:
        raise ValueError("tunedist.doctor.check: the model has no parameters; pass the model you train")
    gpu = model_device_type(model) == "cuda" if gpu is None else gpu
    run_step = step if step is not None else _forward_backward(model, loss_fn)
    saved = None if step is not None else {p: p.grad for p in model.parameters()}
    if saved is not None:
        model.zero_grad(set_to_none=True)
    try:
        timing = measure(model, loader, run_step, options)
    finally:
        for p, g in (saved or {}).items():  # the stand-in step's gradients go; the ones the model had come back
            p.grad = g
    findings = static_findings(model, group, machine) if include_static else []
    env = machine.env if machine is not None else None
    findings += [check_sampler(loader, group, env), check_workers(loader),
                 check_fetch_time(timing, options.fetch_share), check_batch(timing, options.min_batch_per_device),
                 check_precision(model, timing, gpu),
                 check_optimizer(model, optimizer), check_pin_memory(loader, gpu)]
    report = Report(findings, {"fetch_ms": timing.fetch_mean * 1e3, "step_ms": timing.step_mean * 1e3,
                               "batch_per_device": float(timing.batch_size or 0)})
    if show and _world(group, env)[1] == 0:
        print(report.table(), flush=True)
    return report
