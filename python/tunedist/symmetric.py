"""Symmetric CPU buffers: tensors from a `tuned` group's symmetric heap.

Every rank's symmetric tensors live in shared memory its peers on the host map, so a collective on them reads and
writes the peers' buffers directly instead of copying through the group's slots (zero-copy; ``csrc/shm/zero_copy``).
FSDP2 uses them for its all-gather and reduce-scatter staging buffers when asked to
(``model.set_allocate_memory_from_process_group_for_comm(True)``); call the functions below to use them in your own
collectives (tensor-parallel inference, custom training loops)::

    buf = tunedist.symmetric_empty(1 << 20, dtype=torch.bfloat16)   # from the default group's heap
    buf.copy_(activations.view(-1))
    dist.all_reduce(buf)                                             # zero-copy when every rank's buffer is symmetric

A collective on buffers that every rank has symmetric (an all_gather's output, a reduce_scatter's input, an
all_reduce's or a broadcast's tensor), contiguous, and at least ``min_bytes`` long (64 KiB) runs zero-copy or
copying as the group measured them on this host, per collective and size class (both ranks, or all, always take the
same path; ``symmetric_heap_stats()["paths"]`` shows each class's choice and timings). ``TUNEDIST_SYMMETRIC_MIN_BYTES``
overrides the measurement: from that many bytes every such collective runs zero-copy, below it copying. Otherwise, on
any rank, every rank takes the copying path, with the same results. Symmetric tensors
are ordinary CPU tensors: views, slices and reuse after ``wait()`` are safe. The heap grows in chunks of
``TUNEDIST_SYMMETRIC_CHUNK_BYTES`` (default 64 MiB) up to ``TUNEDIST_SYMMETRIC_HEAP_BYTES`` (default 16 GiB) per rank
and group, each chunk reserved in /dev/shm when it is created; freed tensors return to the heap, which keeps its
chunks until the group and every tensor from it are gone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

_CPU = torch.device("cpu")


def _cpu_backend(group: dist.ProcessGroup | None, what: str):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(_CPU)
    except RuntimeError as e:
        raise ValueError(f"tunedist.{what}: the group has no CPU backend ({e}); create it with backend='tuned' or "
                         "'cpu:tuned,cuda:nccl'") from None
    name = backend.name() if hasattr(backend, "name") else ""
    if name != "tuned":
        raise ValueError(f"tunedist.{what}: the group's CPU backend is {name!r}, not 'tuned': symmetric buffers "
                         "come from a tuned group (init_process_group('tuned') or new_group(backend='tuned'))")
    return backend


def symmetric_empty(size: int | Sequence[int], *, dtype: torch.dtype = torch.float32,
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """An uninitialised CPU tensor of shape `size` from `group`'s symmetric heap (default group when None).

    Raises ValueError when the group's CPU backend is not `tuned`, and RuntimeError naming the fix when the heap's
    bound (TUNEDIST_SYMMETRIC_HEAP_BYTES) or /dev/shm is full.
    """
    shape = (int(size),) if isinstance(size, int) else tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise ValueError(f"tunedist.symmetric_empty: negative size in {shape}")
    backend = _cpu_backend(group, "symmetric_empty")
    flat = backend.allocate_tensor(math.prod(shape), dtype=dtype, device=_CPU)
    return flat.view(shape)


def is_symmetric(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> bool:
    """Whether every element of `tensor` (a view included) lies in this rank's symmetric heap of `group`."""
    from . import _C  # noqa: PLC0415

    return bool(_C.is_symmetric(_cpu_backend(group, "is_symmetric"), tensor))


def symmetric_heap_stats(group: dist.ProcessGroup | None = None) -> dict:
    """This rank's heap of `group`: reserved_bytes, in_use_bytes, peak_in_use_bytes, chunks, allocations and
    chunk_creations (allocations that needed a new chunk: the rest came from the cache); zero_copy_ops and
    copy_restarts (operations that ran zero-copy, and that restarted on the copying path because some rank's buffer
    was not symmetric); min_bytes, the least buffer that may run zero-copy on this group (when it is on one host);
    zero_copy_choice, "measured" (the default) or "forced" (TUNEDIST_SYMMETRIC_MIN_BYTES set); and paths, one dict
    per collective and size class the group has measured: op, bytes_from (the class's least size), path ("copy",
    "zero-copy cached" or "zero-copy streaming"), windows (probe windows so far) and ns_per_byte (this rank's
    median per path in the last window)."""
    from . import _C  # noqa: PLC0415

    return dict(_C.symmetric_heap_stats(_cpu_backend(group, "symmetric_heap_stats")))
