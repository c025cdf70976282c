"""Bucket settings the tuner can try, and how each one becomes a DistributedDataParallel of the running torch.

DDP's bucket limits, as read in torch/nn/parallel/distributed.py (2.11 and 2.15) and the reducer:
- bucket_cap_mb=None (the default): cap 25 MiB, and the first bucket of the rebuilt assignment (the gradients
  ready first) is capped at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), read when the DDP is constructed.
- bucket_cap_mb=X: every bucket, the first included, is capped at X MiB.
- bucket_cap_mb_list=[a, b, ...] (newer torch only): bucket k is capped at the k-th entry, the last one repeating.
So a first bucket other than the cap needs either bucket_cap_mb_list or, for the 25 MiB cap only, a temporary
override of the private dist._DEFAULT_FIRST_BUCKET_BYTES around the construction.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
from dataclasses import dataclass

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .costmodel import MIB

log = logging.getLogger("tunedist.tune")

DEFAULT_CAP_MB = 25.0
HOOKS = ("fp16", "bf16", "powersgd")


def default_first_bucket_bytes() -> int:
    return int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB))


@functools.lru_cache(maxsize=1)
def ddp_accepts_cap_list() -> bool:
    return "bucket_cap_mb_list" in inspect.signature(DistributedDataParallel.__init__).parameters


@dataclass(frozen=True)
class Candidate:
    """cap_mb None: DDP's default (25 MiB, first bucket 1 MiB). first_mb None: the first bucket has the cap too."""

    cap_mb: float | None
    first_mb: float | None = None

    @property
    def is_default(self) -> bool:
        return self.cap_mb is None

    def limits(self) -> list:
        """The reducer's byte limits: bucket k closes at limits[min(k, len - 1)]."""
        if self.cap_mb is None:
            first, cap = default_first_bucket_bytes(), int(DEFAULT_CAP_MB * MIB)
        else:
            cap = int(self.cap_mb * MIB)
            first = cap if self.first_mb is None else int(self.first_mb * MIB)
        return [first, cap] if first != cap else [cap]

    @property
    def label(self) -> str:
        if self.cap_mb is None:
            return f"default ({DEFAULT_CAP_MB:g} MB, first {default_first_bucket_bytes() / MIB:g})"
        return f"{self.cap_mb:g} MB" + (f", first {self.first_mb:g}" if self.first_mb is not None else "")

    def supported(self) -> bool:
        if self.cap_mb is None or self.first_mb is None or self.first_mb == self.cap_mb:
            return True
        return ddp_accepts_cap_list() or (self.cap_mb == DEFAULT_CAP_MB
                                          and hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES"))


def make_candidates(total_bytes: int, caps_mb=None, first_mb=None) -> list:
    """The search space: caps in powers of 2 MiB from 1/256 of the model (at least 1/16 MiB: a bucket per tensor
    for most models) up to the whole model, each alone and, where the running torch lets the first bucket differ,
    with each smaller first bucket in first_mb."""
    if caps_mb is None:
        total_mb = total_bytes / MIB
        caps_mb, cap = [], 1 / 16
        while cap < 2 * total_mb:
            if cap >= total_mb / 256:
                caps_mb.append(cap)
            cap *= 2
    out = [Candidate(c) for c in caps_mb]
    for f in first_mb or ():
        out += [Candidate(c, f) for c in caps_mb if f < c and Candidate(c, f).supported()]
    return out


@contextlib.contextmanager
def _first_bucket_override(nbytes: int | None):
    """Sets the private dist._DEFAULT_FIRST_BUCKET_BYTES for the duration of one DDP construction."""
    if nbytes is None:
        yield
        return
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = nbytes
    try:
        yield
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved


def build_ddp(module, candidate: Candidate, process_group=None, **ddp_kwargs) -> DistributedDataParallel:
    """A DDP of `module` whose reducer uses `candidate`'s bucket limits."""
    clash = {"bucket_cap_mb", "bucket_cap_mb_list"} & set(ddp_kwargs)
    if clash:
        raise ValueError(f"tunedist.tune: {sorted(clash)} is what the tuner chooses; drop it from the DDP arguments")
    kwargs, override = {}, None
    if candidate.cap_mb is not None:
        if candidate.first_mb is None or candidate.first_mb == candidate.cap_mb:
            kwargs["bucket_cap_mb"] = candidate.cap_mb
        elif ddp_accepts_cap_list():
            kwargs["bucket_cap_mb_list"] = [candidate.first_mb, candidate.cap_mb]
        elif candidate.cap_mb == DEFAULT_CAP_MB and hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES"):
            override = int(candidate.first_mb * MIB)  # bucket_cap_mb=None: DDP reads the private default
        else:
            raise ValueError(f"tunedist.tune: candidate {candidate.label} needs a first bucket apart from the cap, "
                             "which this torch's DistributedDataParallel cannot take (no bucket_cap_mb_list); "
                             "use candidates without first_mb")
    with _first_bucket_override(override):
        return DistributedDataParallel(module, process_group=process_group, **kwargs, **ddp_kwargs)


def dispose_ddp(ddp: DistributedDataParallel) -> None:
    """Detaches a trial DDP's autograd hooks from the shared module's parameters before the next one is built."""
    reducer = getattr(ddp, "reducer", None)
    if reducer is not None and hasattr(reducer, "_remove_autograd_hooks"):
        reducer._remove_autograd_hooks()


def register_hook(ddp: DistributedDataParallel, hook: str, process_group=None, source: str = "auto") -> str:
    """Registers a gradient compression hook by name: tunedist.hooks when it is installed (source "auto"),
    otherwise (or with source "torch") torch's own hook of the same kind, with a logged note. Returns which one
    was registered."""
    if hook not in HOOKS:
        raise ValueError(f"tunedist.tune: unknown hook {hook!r}; choose one of {', '.join(HOOKS)} or None")
    if source not in ("auto", "torch"):
        raise ValueError(f"tunedist.tune: hook source must be 'auto' or 'torch', got {source!r}")
    if source == "auto" and importlib.util.find_spec("tunedist.hooks") is not None:
        import tunedist.hooks  # noqa: PLC0415  (another component; loaded only when asked for)

        tunedist.hooks.register(ddp, hook)
        return f"tunedist.hooks.register(model, {hook!r})"
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: PLC0415

    if hook == "powersgd":
        if next(ddp.module.parameters()).device.type == "cpu":
            raise ValueError(
                f"tunedist.tune: register_hook('powersgd') on rank {dist.get_rank()}: torch's powerSGD_hook, the "
                "stand-in while tunedist.hooks is not installed, issues all_reduces from future callbacks, which "
                "CPU backends run on their worker threads while DDP issues the next buckets: ranks then issue "
                "collectives in different orders (tuned fails with a mismatch; gloo can hang). Install "
                "tunedist.hooks for PowerSGD on CPU, or use 'fp16'/'bf16'")
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        used = "torch powerSGD_hook (rank 1, from iteration 2)"
    else:
        fn = default_hooks.fp16_compress_hook if hook == "fp16" else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(process_group, fn)
        used = f"torch {fn.__name__}"
    log.info("tunedist.tune: registered %s in place of tunedist.hooks' %r hook (%s)", used, hook,
             "asked for torch's" if source == "torch" else "tunedist.hooks is not installed")
    return used
