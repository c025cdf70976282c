"""tunedist's DDP communication hooks: torch's hooks in C++, as drop-in modules and as native Reducer hooks.

Drop-in (one import line changes; DDP calls a thin Python function per bucket that hands the bucket to C++)::

    from tunedist.hooks import default, powerSGD
    ddp.register_comm_hook(powerSGD.PowerSGDState(None, start_powerSGD_iter=10), powerSGD.powerSGD_hook)

Native (the C++ hook is installed on DDP's Reducer; no Python runs per bucket)::

    state = tunedist.hooks.register(ddp, "powersgd", matrix_approximation_rank=2, start_powerSGD_iter=10)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C
from . import default, powerSGD

__all__ = ["register", "default", "powerSGD", "HOOKS", "cuda_kernels_built"]

HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "batched_powersgd")
_LOW_PRECISION = {"fp16": torch.float16, "bf16": torch.bfloat16}
_POWERSGD = ("powersgd", "batched_powersgd")


def cuda_kernels_built() -> bool:
    """Whether this build has the hooks' CUDA kernels (CMake option TUNEDIST_CUDA_KERNELS, on by default where nvcc
    is found): fp16/bf16 compression and PowerSGD's error feedback on CUDA tensors then run one fused pass each
    instead of two ATen ops, with the same results."""
    return bool(_C._hooks.cuda_kernels_built())


def _check_reduces(group, dtype: torch.dtype, device: torch.device, what: str) -> None:
    """Refuses a backend that cannot allreduce `dtype` (a one-element probe; every rank registers, so all probe)."""
    try:
        dist.all_reduce(torch.zeros(1, dtype=dtype, device=device), group=group)
    except Exception as exc:
        rank = group.rank()
        raise RuntimeError(
            f"tunedist.hooks.register({what!r}): rank {rank}: the process group cannot allreduce {dtype} on "
            f"{device} ({type(exc).__name__}: {exc}). Use a backend that reduces {dtype} (e.g. 'tuned' or gloo on "
            "CPU, NCCL on CUDA) or another hook.") from exc


def _check_unhooked(ddp_model) -> None:
    native = getattr(ddp_model, "_tunedist_comm_hook", None)
    if native is not None:
        raise RuntimeError(f"tunedist.hooks.register: this DDP model already has the native hook {native!r}; DDP's "
                           "Reducer takes one communication hook per model. Build a new DistributedDataParallel "
                           "to use another hook.")
    if getattr(ddp_model, "_comm_hooks", None):
        raise RuntimeError("tunedist.hooks.register: this DDP model already has a hook from register_comm_hook; "
                           "DDP's Reducer takes one communication hook per model.")


def register(ddp_model, hook: str, *, process_group=None, wrapper: str | None = None, **options):
    """Install tunedist's C++ hook ``hook`` (one of :data:`HOOKS`) on ``ddp_model``'s Reducer.

    ``process_group``: the group the hook reduces over (default: the DDP model's). ``wrapper``: ``"fp16"`` or
    ``"bf16"`` to run the hook on the bucket cast to that precision (torch's ``fp16_compress_wrapper``).
    ``options``: :class:`~tunedist.hooks.powerSGD.PowerSGDState`'s arguments, for the PowerSGD hooks.
    Returns the hook's state: the :class:`PowerSGDState` for PowerSGD, else the process group.
    """
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"tunedist.hooks.register: expects a DistributedDataParallel model, got {type(ddp_model)}")
    if hook not in HOOKS:
        raise ValueError(f"tunedist.hooks.register: unknown hook {hook!r}; expected one of {HOOKS}")
    if wrapper is not None and wrapper not in _LOW_PRECISION:
        raise ValueError(f"tunedist.hooks.register: wrapper must be 'fp16', 'bf16' or None, got {wrapper!r}")
    if options and hook not in _POWERSGD:
        raise TypeError(f"tunedist.hooks.register({hook!r}): takes no options, got {sorted(options)}")
    _check_unhooked(ddp_model)
    group = process_group if process_group is not None else ddp_model.process_group
    device = next(ddp_model.module.parameters()).device
    for name in {hook, wrapper} & set(_LOW_PRECISION):
        _check_reduces(group, _LOW_PRECISION[name], device, name)
    state = powerSGD.PowerSGDState(group, **options) if hook in _POWERSGD else None
    _C._hooks.register(ddp_model.reducer, hook, group, state._cpp if state is not None else None, wrapper or "")
    ddp_model._tunedist_comm_hook = hook if wrapper is None else f"{wrapper}({hook})"
    if getattr(ddp_model, "logger", None) is not None:
        ddp_model.logger._set_comm_hook_name(f"tunedist.hooks.{ddp_model._tunedist_comm_hook}")
    return state if state is not None else group
