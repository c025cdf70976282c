"""tunedist: a tuned communication layer for PyTorch distributed training.

The c10d backend ``tuned``: CPU tensors use shared-memory collectives among the ranks of a host. Pick it with
``dist.init_process_group("tuned")`` or ``"cpu:tuned,cuda:nccl"`` under torchrun. A script needs no ``import
tunedist`` for that: the package declares ``tuned`` in the ``torch.distributed.backends`` entry-point group, which
torch's c10d (2.15) reads for a backend name it does not know (``Backend._ensure_backend_registered``) and answers by
calling :func:`register_backend`. ``import tunedist`` registers it too; either way it is registered once.

In a build with NCCL support (``nccl_compiled_in()``) ``tuned`` registers for ``cpu`` and ``cuda``: plain ``"tuned"``
then gives one backend object for both device types, and its CUDA calls go to the backend torch itself makes for
``"nccl"`` (torch's registered creator, :func:`nccl_creator`: nccl2 on torch 2.15), created at the group's first CUDA
call, and every c10d feature of that backend is forwarded. It logs what NCCL will use there (logger ``tunedist``,
rank 0).
"""

from __future__ import annotations

import importlib
import logging
import os
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from ._paths import cmake_prefix_path, include_dir
from .symmetric import is_symmetric, symmetric_empty, symmetric_heap_stats

__all__ = ["BACKEND_NAME", "register_backend", "cmake_prefix_path", "include_dir", "version", "simd_level",
           "nccl_compiled_in", "nccl_creator", "flight_recorder_enabled", "symmetric_empty", "is_symmetric",
           "symmetric_heap_stats", "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]

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

    Registered with torch's extended API: torch hands over the group's options (name, global ranks, the group itself,
    ``enable_reconfigure``: a group that has no members until ``_reconfigure``) and the caller's ``pg_options``, which
    the CUDA side gets as torch's ``"nccl"`` would. The CPU side takes its settings from TUNEDIST_* environment
    variables; this process's stable rank (in its reconfigure handle) is its global rank.
    """
    _check_torchcomms()
    ranks = list(opts.global_ranks_in_group or [])
    stable = ranks[opts.group_rank] if opts.group_rank < len(ranks) else opts.group_rank
    return _C.create_backend(opts.store, opts.group_rank, opts.group_size, opts.timeout, _on_nccl_created,
                             _make_gloo_group, enable_reconfigure=bool(getattr(opts, "enable_reconfigure", False)),
                             stable_rank=stable, nccl_factory=_CudaSide(opts, backend_options))


def nccl_creator():
    """torch's registered creator for ``"nccl"``, as ``Backend._plugins`` holds it, or None.

    That is what the name means in the installed torch: on 2.15 ``_create_nccl2_process_group`` (c10d's nccl2) unless
    ``TORCH_DIST_USE_NCCL2=0`` was set when torch registered it, then ``_create_nccl_process_group`` (the classic
    ProcessGroupNCCL); whatever a later torch, or a user who registered another ``"nccl"``, puts there. None where c10d
    builds ``"nccl"`` itself instead of through a registered creator; the CUDA side is then made in C++ as that torch
    makes it (the classic ProcessGroupNCCL, backend/cuda/nccl_factory.cpp).
    """
    ensure = getattr(dist.Backend, "_ensure_backend_registered", None)
    if ensure is not None:
        ensure(dist.Backend.NCCL)
    return getattr(dist.Backend, "_plugins", {}).get(dist.Backend.NCCL.upper())


class _CudaSide:
    """Makes a ``tuned`` group's CUDA side as torch makes a group's ``"nccl"`` backend: torch's own creator for the
    name (:func:`nccl_creator`), given what torch would give it for this group. The C++ side (NcclSide) calls it with
    the GIL at the group's first CUDA call, or when torch binds the group to a CUDA device; it is never called in a
    job that makes no CUDA call, so such a job never touches CUDA or NCCL.
    """

    def __init__(self, opts, backend_options):
        nccl_options = getattr(dist, "ProcessGroupNCCL", None)
        nccl_options = getattr(nccl_options, "Options", None)
        if backend_options is not None and (nccl_options is None or not isinstance(backend_options, nccl_options)):
            raise TypeError(
                f"tunedist: pg_options of type {type(backend_options).__name__}: a `tuned` group takes "
                "ProcessGroupNCCL.Options (for its CUDA side, as \"nccl\" takes them) or none")
        self.options = backend_options
        self.group_name = opts.group_id
        self.global_ranks = list(opts.global_ranks_in_group)
        self.enable_reconfigure = bool(getattr(opts, "enable_reconfigure", False))
        # Weak: the group holds its backend, which holds this (a strong reference would keep the group alive).
        group = getattr(opts, "process_group", None)  # where this torch hands the group over
        self._group = weakref.ref(group) if group is not None else None

    def _group_of(self, group_name: str):
        """The ProcessGroup named `group_name` and its global ranks in group-rank order. The group this creator made
        is known from its options (also before torch lists it: torch binds a device and connects it first); a group
        split or shrunk from it in C++ shares this object and is found by name in torch's registry."""
        if group_name == self.group_name:
            return (self._group() if self._group is not None else None), self.global_ranks
        world = dist.distributed_c10d._world
        for group, name in world.pg_names.items():
            if name == group_name:
                ranks = world.pg_group_ranks.get(group, {})
                return group, sorted(ranks, key=ranks.get)
        return None, []

    def options_for(self, store, rank: int, size: int, timeout: timedelta, group_name: str):
        """The _DistributedBackendOptions torch would give "nccl" for this group (torch's creators read its device
        from the group's bound device)."""
        group, global_ranks = self._group_of(group_name)
        opts = dist.distributed_c10d._DistributedBackendOptions()
        opts.store = store
        opts.group_rank = rank
        opts.group_size = size
        opts.timeout = timeout
        opts.group_id = group_name
        opts.global_ranks_in_group = global_ranks
        if group is not None and hasattr(opts, "process_group"):
            opts.process_group = group
        if hasattr(opts, "enable_reconfigure"):
            opts.enable_reconfigure = self.enable_reconfigure
        return opts

    def __call__(self, store, rank: int, size: int, timeout: timedelta, group_name: str, device=None):
        """Returns the backend, or None to have the C++ side make it (no registered creator for "nccl"). `device`,
        the group's bound CUDA device, is what the creator reads from the group itself."""
        plugin = nccl_creator()
        if plugin is None:
            return None
        if plugin.extended_api:
            backend = plugin.creator_fn(self.options_for(store, rank, size, timeout, group_name), self.options)
        else:
            backend = plugin.creator_fn(store, rank, size, timeout)
        if isinstance(backend, dist.ProcessGroup) or backend is None:
            raise TypeError(f"torch's creator for \"nccl\" ({plugin.creator_fn.__qualname__}) returned "
                            f"{type(backend).__name__}, not a c10d Backend that a `tuned` group can hold")
        return backend


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
