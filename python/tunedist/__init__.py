"""tunedist: a tuned communication layer for PyTorch distributed training.

``import tunedist`` registers the c10d backend ``tuned``: CPU tensors use shared-memory collectives among the
ranks of a host. Pick it with ``dist.init_process_group("tuned")`` or ``"cpu:tuned,cuda:nccl"`` under torchrun.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ._paths import cmake_prefix_path, include_dir

__all__ = ["BACKEND_NAME", "cmake_prefix_path", "include_dir", "version", "simd_level"]

BACKEND_NAME = "tuned"


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


def _torchcomms_requested() -> bool:
    config = getattr(dist, "config", None)
    if config is not None and getattr(config, "use_torchcomms", False):
        return True
    value = os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def _check_torchcomms() -> None:
    if _torchcomms_requested():
        raise RuntimeError(
            "tunedist: TORCH_DISTRIBUTED_USE_TORCHCOMMS is set, so torch routes process groups through TorchComms "
            "and never calls plugin backends such as 'tuned'. Unset TORCH_DISTRIBUTED_USE_TORCHCOMMS (and "
            "torch.distributed.config.use_torchcomms) to use tunedist."
        )


def _create_backend(store, rank: int, size: int, timeout: timedelta):
    """The creator torch calls for every group (and sub-group) that maps a device to ``tuned``."""
    _check_torchcomms()
    return _C.create_backend(store, rank, size, timeout, _make_gloo_group)


def _make_gloo_group(store, rank: int, size: int, timeout: timedelta):
    """Makes a gloo group between hosts for a group that spans several (called by the backend, lazily).

    torch's own constructor builds the devices as init_process_group("gloo") does: one per interface in
    GLOO_SOCKET_IFNAME, else the default device of this host's name.
    """
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _register() -> None:
    _check_torchcomms()
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["cpu"])


_register()


def version() -> str:
    return _C.version()


def simd_level() -> str:
    """The reduction kernels' SIMD level in use (TUNEDIST_SIMD=scalar|avx2|avx512 pins one)."""
    return _C.simd_level()
