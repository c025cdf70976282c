"""tunedist: a tuned communication layer for PyTorch distributed training.

The c10d backend ``tuned``: CPU tensors use shared-memory collectives among the ranks of a host. Pick it with
``dist.init_process_group("tuned")`` or ``"cpu:tuned,cuda:nccl"`` under torchrun. A script needs no ``import
tunedist`` for that: the package declares ``tuned`` in the ``torch.distributed.backends`` entry-point group, which
torch's c10d (2.15) reads for a backend name it does not know (``Backend._ensure_backend_registered``) and answers by
calling :func:`register_backend`. ``import tunedist`` registers it too; either way it is registered once.

In a build with NCCL support (``nccl_compiled_in()``) ``tuned`` registers for ``cpu`` and ``cuda``: plain ``"tuned"``
then gives one backend object for both device types, and its CUDA calls go through a wrapped ProcessGroupNCCL that
it creates at the first CUDA call. It logs what NCCL will use there (logger ``tunedist``, rank 0).
"""

from __future__ import annotations

import importlib
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ._paths import cmake_prefix_path, include_dir
from .symmetric import is_symmetric, symmetric_empty, symmetric_heap_stats

__all__ = ["BACKEND_NAME", "register_backend", "cmake_prefix_path", "include_dir", "version", "simd_level",
           "nccl_compiled_in", "flight_recorder_enabled", "symmetric_empty", "is_symmetric", "symmetric_heap_stats",
           "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]

BACKEND_NAME = "tuned"
_log = logging.getLogger("tunedist")


def _load_native():
    try:
        from . import _C  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the install
        hint = (
            "an undefined symbol usually means it was built against another torch than the running "
            f"{torch.__version__}, or the build is incomplete"
            if "undefined symbol" in str(exc)
            else "the build may be missing or incomplete"
        )
        raise ImportError(
            f"tunedist: cannot load its native module ({exc}); {hint}. Rebuild with "
            "`pip install --no-build-isolation .` in the tunedist source tree."
        ) from exc
    built = _C.torch_version_built()
    if built != torch.__version__:
        raise ImportError(
            f"tunedist was built against torch {built} but torch {torch.__version__} is running; the C++ ABI of "
            "c10d is not stable across releases. Rebuild tunedist: `pip install --no-build-isolation .`"
        )
    return _C


_C = _load_native()
# torch.distributed._symmetric_memory on CPU tensors: empty, rendezvous and the symm_mem operators over the tuned
# groups' symmetric heaps (docs/design.md#torchs-symmetric-memory-and-windows-on-cpu).
_C.register_symmetric_memory_allocator()

from .ops import all_gather_into_tensor, all_reduce, broadcast, reduce_scatter_tensor  # noqa: E402  (needs _C's operators)


def _torchcomms_bypasses_plugins() -> bool:
    """Whether this torch would build a ``tuned`` group through TorchComms instead of calling its creator.

    Decided by what the installed c10d can do, not by its version: a c10d that asks TorchComms per backend name
    (``_torchcomms_handles_backend``) sends only the names TorchComms owns there, and plugins fall through to their
    creator; a c10d with a TorchComms switch but no such test routes every group through TorchComms once it is on
    (``_use_torchcomms_enabled``: the switch set and the torchcomms package importable); a c10d with neither has no
    TorchComms path at all.
    """
    c10d = dist.distributed_c10d
    handles = getattr(c10d, "_torchcomms_handles_backend", None)
    if handles is not None:
        return bool(handles(BACKEND_NAME))
    enabled = getattr(c10d, "_use_torchcomms_enabled", None)
    if enabled is not None:
        return bool(enabled())
    return False


def _check_torchcomms() -> None:
    if _torchcomms_bypasses_plugins():
        raise RuntimeError(
            "tunedist: TORCH_DISTRIBUTED_USE_TORCHCOMMS is set, so torch routes process groups through TorchComms "
            "and never calls plugin backends such as 'tuned'. Unset TORCH_DISTRIBUTED_USE_TORCHCOMMS (and "
            "torch.distributed.config.use_torchcomms) to use tunedist."
        )


def _on_nccl_created(rank: int, size: int) -> None:
    """Runs when a group's NCCL side is created (its first CUDA call): global rank 0 logs what NCCL will use."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    try:
        from .nccl_env import nccl_findings, nccl_summary  # noqa: PLC0415

        info = _C.nccl_build_info()
        _log.info("tunedist: NCCL side created for a group of %d (NCCL %s in torch, headers %s); %s", size,
                  info["torch_nccl_version"], info["header_version"], nccl_summary())
        for finding in nccl_findings():
            if finding.verdict != "ok":
                _log.warning("tunedist: %s: %s. %s", finding.check, finding.evidence, finding.fix)
    except Exception as exc:  # noqa: BLE001 - a failed log line must not fail the collective that triggered it
        _log.warning("tunedist: could not describe the NCCL settings: %s", exc)


def _create_backend(opts, backend_options=None):
    """The creator torch calls for every group (and sub-group) that maps a device to ``tuned``.

    Registered with ``extended_api=True``: torch hands over its ``_DistributedBackendOptions``, which carry
    ``enable_reconfigure`` (a group that has no members until ``_reconfigure``) and the group's global ranks (this
    process's stable rank in its reconfigure handle). ``backend_options`` (``pg_options``) is not read: ``tuned``
    takes its settings from TUNEDIST_* environment variables, as before the extended creator.
    """
    _check_torchcomms()
    ranks = list(opts.global_ranks_in_group or [])
    stable = ranks[opts.group_rank] if opts.group_rank < len(ranks) else opts.group_rank
    return _C.create_backend(opts.store, opts.group_rank, opts.group_size, opts.timeout, _on_nccl_created,
                             _make_gloo_group, enable_reconfigure=bool(getattr(opts, "enable_reconfigure", False)),
                             stable_rank=stable)


def _torchcomms_communicator(backend):
    """torch 2.15's split_group, with TorchComms on (the torchcomms package importable and the switch set), appends
    ``get_comm()`` of the new group's backend to the TorchComms communicators that destroy_process_group finalizes, as
    if every backend were TorchComms' wrapper. A ``tuned`` group is its own communicator."""
    return backend


def _finalize(backend) -> None:
    """TorchComms' name for shutting a communicator down. destroy_process_group calls it on what split_group listed,
    right before it shuts every group down (pg.shutdown()), so there is nothing left to do here."""


_C.TunedBackend.get_comm = _torchcomms_communicator
_C.TunedBackend.finalize = _finalize


def nccl_compiled_in() -> bool:
    """Whether this build has the NCCL side, so that ``tuned`` serves CUDA tensors too."""
    return bool(_C.nccl_build_info()["compiled_in"])


def _make_gloo_group(store, rank: int, size: int, timeout: timedelta):
    """Makes a gloo group between hosts for a group that spans several (called by the backend, lazily).

    torch's own constructor builds the devices as init_process_group("gloo") does: one per interface in
    GLOO_SOCKET_IFNAME, else the default device of this host's name.
    """
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def flight_recorder_enabled() -> bool:
    """Whether torch's flight-recorder hook records `tuned` collectives (TUNEDIST_FLIGHT_RECORDER=1; default off).

    torch >= 2.15 attaches a FlightRecorderHook to every group of a plugin backend (gloo and NCCL record
    themselves). It runs on every call: about 9,000 instructions, 2-3 us, as much as the rest of a small tuned
    all_reduce (benchmarks/bench_call_budget.py). tunedist's own errors already name the op, its sequence number and
    the ranks that did not arrive, which is what the recorder's dumps are read for; set TUNEDIST_FLIGHT_RECORDER=1
    before `import tunedist` to have tuned's collectives in the dumps too.
    """
    return os.environ.get("TUNEDIST_FLIGHT_RECORDER", "0").strip().lower() in ("1", "true", "yes", "on")


def _skip_flight_recorder_hook() -> None:
    # torch skips the hook for the backends in this set (its name says "self-recording"); a torch without the set
    # attaches no hook to plugins at all.
    skipped = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(skipped, set) and not flight_recorder_enabled():
        skipped.add(BACKEND_NAME)


def register_backend() -> None:
    """Registers the c10d backend ``tuned`` with torch; a second call does nothing.

    torch calls it through the ``torch.distributed.backends`` entry point the first time a backend string names
    ``tuned`` (``init_process_group``, ``new_group``, a launcher's ``process_group_backend``); ``import tunedist``
    calls it too. Raises RuntimeError where torch would route the group around plugin backends (TorchComms on a
    torch that bypasses plugins).
    """
    _check_torchcomms()
    _skip_flight_recorder_hook()
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    # register_backend never takes over a device's default backend (gloo for cpu, nccl for cuda stay).
    devices = ["cpu", "cuda"] if nccl_compiled_in() else ["cpu"]
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=devices)


register_backend()


def version() -> str:
    return _C.version()


def simd_level() -> str:
    """The reduction kernels' SIMD level in use (TUNEDIST_SIMD=scalar|avx2|avx512 pins one)."""
    return _C.simd_level()


# The tool subpackages load on first use: `import tunedist` stays as light as the backend needs (torch imports the
# package through its entry point in every rank), while `tunedist.hooks`, `tunedist.tune`, `tunedist.doctor` and
# `tunedist.bench` still work after a plain `import tunedist`, as a user of torch's own packages expects.
_LAZY_SUBPACKAGES = ("bench", "doctor", "hooks", "tune")


def __getattr__(name: str):
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tunedist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBPACKAGES))
