"""Workers and references for the hook tests (module level, so spawned ranks can import them).

``train(rank, group, install, ...)`` runs DDP_STEPS SGD steps of DDP on a model that mixes PowerSGD-compressed
matrices, same-shape matrices (for batching), matrices below the compression threshold and biases, with data that
depends only on the rank and step. ``install(ddp)`` registers the hook under test and returns its state.
"""

from __future__ import annotations

import math
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_default
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import tunedist.hooks as td_hooks
from tunedist.hooks import default as td_default
from tunedist.hooks import powerSGD as td_psgd

DDP_STEPS = 20


class MixedNet(nn.Module):
    """64x32, 64x64 (twice: same shape), 8x64 (compressed at rank <= 3 only), 2x64 (never compressed), biases."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 64)
        self.fc4 = nn.Linear(64, 8)
        self.head = nn.Linear(64, 2)

    def forward(self, x):
        h = torch.tanh(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))))
        return torch.cat([self.fc4(h), self.head(h)], dim=1)


def batch(rank: int, step: int, width: int = 32, out: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 * rank + step)
    return torch.randn(16, width, generator=gen), torch.randn(16, out, generator=gen)


def train(rank: int, group, install, steps: int = DDP_STEPS, model_fn=MixedNet, ddp_kwargs=None, model=None,
          start_step: int = 0, width: int = 32, out: int = 10):
    """Trains (a fresh seeded model unless `model` is given); returns (parameters, hook state, ddp)."""
    if model is None:
        torch.manual_seed(0)
        model = model_fn()
    ddp = DDP(model, process_group=group, **(ddp_kwargs or {}))
    state = install(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(start_step, start_step + steps):
        x, y = batch(rank, step, width, out)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, state, ddp


# ---------------------------------------------------------------------------------------------------------------
# torch's batched_powerSGD_hook with its one bug fixed: _orthogonalize gets the 3-D (1, s, r) view it asserts.
# Everything else is torch's algorithm (padding, error feedback, warm start, seeds, statistics).

def corrected_batched_powerSGD_hook(state, bucket):
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size = group.size()
    input_tensor = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return torch_default._allreduce_fut(group, input_tensor)
    total_length = input_tensor.shape[0]
    if total_length == 0:  # an empty bucket: nothing to compress (torch's cannot orthogonalise a 0 x r matrix)
        state.maybe_increase_iter(bucket)
        fut = torch.futures.Future()
        fut.set_result(input_tensor)
        return fut
    state.total_numel_before_compression += total_length
    side = math.ceil(math.sqrt(total_length))
    state.total_numel_after_compression += side * state.matrix_approximation_rank * 2
    padded = torch.zeros(side * side, dtype=input_tensor.dtype)
    padded[:total_length] = input_tensor
    index = bucket.index()
    copy = None
    if state.use_error_feedback:
        if index in state.error_dict:
            padded.add_(state.error_dict[index])
        else:
            state.error_dict[index] = torch.zeros(side * side, dtype=input_tensor.dtype)
        copy = padded.clone()
    matrix = padded.view(side, side)
    if not state.warm_start or index not in state.p_memory_dict:
        state.p_memory_dict[index] = torch.empty(side, state.matrix_approximation_rank)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            state.q_memory_dict[index] = torch.randn(side, state.matrix_approximation_rank, dtype=input_tensor.dtype)
    p, q = state.p_memory_dict[index], state.q_memory_dict[index]
    torch_psgd._orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix, q, out=p)
    dist.all_reduce(p, group=group)
    torch_psgd._orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix.t(), p, out=q)
    dist.all_reduce(q, group=group)
    q.div_(world_size)
    torch.matmul(p, q.t(), out=matrix)
    if state.use_error_feedback:
        state.error_dict[index] = copy - padded
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    input_tensor.copy_(padded[:total_length])
    state.maybe_increase_iter(bucket)
    fut = torch.futures.Future()
    fut.set_result(input_tensor)
    return fut


# ---------------------------------------------------------------------------------------------------------------
# Variants: name -> (torch reference installer, drop-in installer, native installer), each install(ddp, group).

def _torch_state(group, opts):
    return torch_psgd.PowerSGDState(group, **opts)


def _variants():
    v = {}
    simple = {
        "allreduce": (torch_default.allreduce_hook, td_default.allreduce_hook, "allreduce", None),
        "fp16": (torch_default.fp16_compress_hook, td_default.fp16_compress_hook, "fp16", None),
        "bf16": (torch_default.bf16_compress_hook, td_default.bf16_compress_hook, "bf16", None),
        "fp16_wrapper": (torch_default.fp16_compress_wrapper(torch_default.allreduce_hook),
                         td_default.fp16_compress_wrapper(td_default.allreduce_hook), "allreduce", "fp16"),
    }
    for name, (ref, ours, kind, wrapper) in simple.items():
        v[name] = (lambda ddp, g, ref=ref: _plain_register(ddp, g, ref),
                   lambda ddp, g, ours=ours: (ddp.register_comm_hook(g, ours), g)[1],
                   lambda ddp, g, kind=kind, wrapper=wrapper: td_hooks.register(ddp, kind, process_group=g,
                                                                                wrapper=wrapper))
    for rank, warm, batched in [(1, True, False), (2, False, True), (4, True, True), (4, False, False)]:
        opts = dict(matrix_approximation_rank=rank, start_powerSGD_iter=2, warm_start=warm,
                    batch_tensors_with_same_shape=batched, min_compression_rate=2, random_seed=rank)
        v[f"powersgd_r{rank}_{'warm' if warm else 'cold'}_{'batch' if batched else 'single'}"] = (
            lambda ddp, g, o=opts: _state_register(ddp, _torch_state(g, o), torch_psgd.powerSGD_hook),
            lambda ddp, g, o=opts: _state_register(ddp, td_psgd.PowerSGDState(g, **o), td_psgd.powerSGD_hook),
            lambda ddp, g, o=opts: td_hooks.register(ddp, "powersgd", process_group=g, **o))
    for rank, warm in [(1, True), (2, False)]:
        opts = dict(matrix_approximation_rank=rank, start_powerSGD_iter=2, warm_start=warm, random_seed=3)
        v[f"batched_r{rank}_{'warm' if warm else 'cold'}"] = (
            lambda ddp, g, o=opts: _state_register(ddp, _torch_state(g, o), corrected_batched_powerSGD_hook),
            lambda ddp, g, o=opts: _state_register(ddp, td_psgd.PowerSGDState(g, **o),
                                                   td_psgd.batched_powerSGD_hook),
            lambda ddp, g, o=opts: td_hooks.register(ddp, "batched_powersgd", process_group=g, **o))
    opts = dict(matrix_approximation_rank=2, start_powerSGD_iter=2)
    v["fp16_wrapper_powersgd"] = (
        lambda ddp, g: _state_register(ddp, _torch_state(g, opts),
                                       torch_default.fp16_compress_wrapper(torch_psgd.powerSGD_hook)),
        lambda ddp, g: _state_register(ddp, td_psgd.PowerSGDState(g, **opts),
                                       td_default.fp16_compress_wrapper(td_psgd.powerSGD_hook)),
        lambda ddp, g: td_hooks.register(ddp, "powersgd", process_group=g, wrapper="fp16", **opts))
    return v


def _plain_register(ddp, group, hook):
    ddp.register_comm_hook(group, hook)
    return group


def _state_register(ddp, state, hook):
    ddp.register_comm_hook(state, hook)
    return state


VARIANTS = list(_variants())


def _stats(state):
    return state.compression_stats() if hasattr(state, "compression_stats") else None


def parity_worker(rank: int, world_size: int, names: list[str]) -> dict:
    """Per variant: parameters and statistics of torch's hook and ours (drop-in on gloo, native on gloo and on
    the default `tuned` group), or the traceback of what failed."""
    gloo = dist.new_group(backend="gloo")
    variants = _variants()
    results = {}
    for name in names:
        ref_install, dropin_install, native_install = variants[name]
        try:
            entry = {}
            for label, install, group in [("torch", ref_install, gloo), ("dropin", dropin_install, gloo),
                                          ("native", native_install, gloo),
                                          ("native_tuned", native_install, dist.group.WORLD)]:
                params, state, _ = train(rank, group, lambda ddp, i=install, g=group: i(ddp, g))
                entry[label] = {"params": params, "stats": _stats(state)}
            results[name] = entry
        except Exception:  # noqa: BLE001 - reported per variant
            results[name] = traceback.format_exc()
    return results
