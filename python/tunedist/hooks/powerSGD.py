"""Drop-in replacement for ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``, running in C++.

    from tunedist.hooks import powerSGD                  # instead of torch's powerSGD_hook module
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=10)
    ddp.register_comm_hook(state, powerSGD.powerSGD_hook)

Same constructor arguments and defaults, same attributes (``iter``, ``error_dict``, ``rng``, ...), same results
(torch's Q seeds: ``rng`` is numpy's legacy generator, re-implemented in C++), and the same pickling: the process
group is dropped and comes back as the default group. ``batched_powerSGD_hook`` works (torch's raises on its first
compressed step). ``state_dict()``/``load_state_dict()`` checkpoint the state with tensors only.
"""


import logging

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .. import _C
from .default import _group, _value

__all__ = ["PowerSGDState", "powerSGD_hook", "batched_powerSGD_hook"]

logger = logging.getLogger(__name__)
_hooks = _C._hooks

# torch's PowerSGDState.__slots__, in its order: what __getstate__ pickles (all but process_group).
_TORCH_SLOTS = [
    "process_group", "matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
    "orthogonalization_epsilon", "use_error_feedback", "warm_start", "batch_tensors_with_same_shape", "rng",
    "error_dict", "p_memory_dict", "q_memory_dict", "iter", "total_numel_before_compression",
    "total_numel_after_compression", "compression_stats_logging_frequency", "next_stats_report",
]
# Attributes kept by the C++ state, readable and writable from Python.
_CPP_FIELDS = [s for s in _TORCH_SLOTS if s not in ("process_group", "rng")]
_COUNTERS = ["iter", "total_numel_before_compression", "total_numel_after_compression", "next_stats_report"]
_DICTS = ["error_dict", "p_memory_dict", "q_memory_dict"]
_MAX_SEED = 2**32 - 1


def _cpp_property(name: str) -> property:
    return property(lambda self: getattr(self._cpp, name), lambda self, value: setattr(self._cpp, name, value))


class PowerSGDState:
    """torch's ``PowerSGDState`` (same arguments, defaults and attributes) backed by tunedist's C++ state."""

    __slots__ = ["process_group", "_cpp"]

    def __init__(self, process_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True, orthogonalization_epsilon=0,
                 random_seed=0, compression_stats_logging_frequency=10_000,
                 batch_tensors_with_same_shape: bool = False):
        logger.info(
            "PowerSGD config: matrix_approximation_rank = %s; start_powerSGD_iter = %s; min_compression_rate = %s; "
            "orthogonalization_epsilon = %s; use_error_feedback = %s; warm_start = %s; random_seed = %s; "
            "compression_stats_logging_frequency = %s; batch_tensors_with_same_shape = %s",
            matrix_approximation_rank, start_powerSGD_iter, min_compression_rate, orthogonalization_epsilon,
            use_error_feedback, warm_start, random_seed, compression_stats_logging_frequency,
            batch_tensors_with_same_shape)
        if not 0 <= int(random_seed) <= _MAX_SEED:
            raise ValueError(f"PowerSGDState: random_seed must be between 0 and 2**32 - 1 (numpy's RandomState), "
                             f"got {random_seed}")
        self.process_group = process_group
        self._cpp = _hooks.PowerSGDStateCpp(
            matrix_approximation_rank=int(matrix_approximation_rank), start_powerSGD_iter=int(start_powerSGD_iter),
            min_compression_rate=float(min_compression_rate), use_error_feedback=bool(use_error_feedback),
            warm_start=bool(warm_start), orthogonalization_epsilon=float(orthogonalization_epsilon),
            random_seed=int(random_seed), compression_stats_logging_frequency=int(compression_stats_logging_frequency),
            batch_tensors_with_same_shape=bool(batch_tensors_with_same_shape))

    for _name in _CPP_FIELDS:
        locals()[_name] = _cpp_property(_name)
    del _name

    @property
    def rng(self):
        """numpy's ``RandomState`` at the C++ generator's state (a copy; assign one to set the state)."""
        import numpy as np  # noqa: PLC0415 - numpy only where torch's hook needs it too

        key, pos = self._cpp.rng_state
        rng = np.random.RandomState()
        rng.set_state(("MT19937", np.asarray(key, dtype=np.uint32), pos, 0, 0.0))
        return rng

    @rng.setter
    def rng(self, value) -> None:
        kind, key, pos = value.get_state()[:3]
        if kind != "MT19937":
            raise ValueError(f"PowerSGDState.rng: expected numpy's legacy MT19937 RandomState, got {kind}")
        self._cpp.rng_state = ([int(k) for k in key], int(pos))

    def __getstate__(self):
        """torch's format: every slot but ``process_group`` (``rng`` as numpy's ``RandomState``)."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state.")
        return {slot: getattr(self, slot) for slot in _TORCH_SLOTS if slot != "process_group"}

    def __setstate__(self, state):
        """Restores a state pickled by this class or by torch's ``PowerSGDState``; the group becomes the default."""
        self.process_group = distributed_c10d._get_default_group()
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world size). If a different "
                       "group is desired, please set `self.process_group` after PowerSGD state is loaded.")
        self._cpp = _hooks.PowerSGDStateCpp(
            matrix_approximation_rank=int(state.get("matrix_approximation_rank", 1)), start_powerSGD_iter=1_000,
            min_compression_rate=2.0, use_error_feedback=False, warm_start=False, orthogonalization_epsilon=0.0,
            random_seed=0, compression_stats_logging_frequency=10_000, batch_tensors_with_same_shape=False)
        for slot, value in state.items():
            setattr(self, slot, value)

    def state_dict(self) -> dict:
        """The mutable state as tensors and ints (``torch.save``-able with ``weights_only=True``)."""
        key, pos = self._cpp.rng_state
        sd = {name: getattr(self._cpp, name) for name in _COUNTERS}
        for name in _DICTS:
            sd[name] = {k: v.detach().clone() for k, v in getattr(self._cpp, name).items()}
        sd["rng_key"] = torch.tensor(key, dtype=torch.int64)
        sd["rng_pos"] = pos
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what :meth:`state_dict` returned (hyperparameters stay as constructed)."""
        missing = [k for k in (*_COUNTERS, *_DICTS, "rng_key", "rng_pos") if k not in state_dict]
        if missing:
            raise KeyError(f"PowerSGDState.load_state_dict: missing entries {missing}")
        for name in _COUNTERS:
            setattr(self._cpp, name, int(state_dict[name]))
        for name in _DICTS:
            setattr(self._cpp, name, {int(k): v.detach().clone() for k, v in state_dict[name].items()})
        self._cpp.rng_state = ([int(k) for k in state_dict["rng_key"].tolist()], int(state_dict["rng_pos"]))

    def maybe_increase_iter(self, bucket):
        """torch's: count a step after its last bucket."""
        if bucket.is_last():
            self._cpp.iter = self._cpp.iter + 1
        if self._cpp.iter == self._cpp.start_powerSGD_iter:
            logger.info("Start to apply PowerSGD after %s iterations.", self._cpp.iter)

    def compression_stats(self):
        """(compress rate, numel before compression, numel after compression), as torch's."""
        return self._cpp.compression_stats()

    def workspace_bytes(self) -> int:
        """Bytes of the reused work buffers (not counting the checkpointed error and P/Q memories)."""
        return self._cpp.workspace_bytes()


def _resolve(state, hook_name: str):
    if not isinstance(state, PowerSGDState):
        got = "None" if state is None else type(state).__module__ + "." + type(state).__qualname__
        raise TypeError(f"tunedist.hooks.powerSGD.{hook_name}: the hook state is {got}; pass a "
                        "tunedist.hooks.powerSGD.PowerSGDState: ddp.register_comm_hook(PowerSGDState(process_group, "
                        f"...), powerSGD.{hook_name})")
    return state._cpp, _group(state.process_group)


def powerSGD_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook``: layer-wise low-rank compression with error feedback and warm start, in C++."""
    cpp, group = _resolve(state, "powerSGD_hook")
    return _hooks.run_powersgd(cpp, group, bucket).then(_value)


def batched_powerSGD_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``batched_powerSGD_hook`` (the whole bucket as one square matrix), working, in C++."""
    cpp, group = _resolve(state, "batched_powerSGD_hook")
    return _hooks.run_batched_powersgd(cpp, group, bucket).then(_value)
