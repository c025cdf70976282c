"""Drop-in replacements for ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``, running in C++.

``ddp.register_comm_hook(process_group, fp16_compress_hook)`` works as with torch's module: same names, same
signatures, same results; the whole bucket is handled by one C++ call (compression, division and decompression are
in place in the bucket on CPU: no second buffer). ``state`` is the process group, ``None`` meaning the default group,
as in torch.
"""


from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .. import _C

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
           "bf16_compress_wrapper"]

_hooks = _C._hooks


def _group(process_group) -> dist.ProcessGroup:
    group = process_group if process_group is not None else dist.group.WORLD
    if group is None:
        raise RuntimeError("tunedist.hooks: no process group: call torch.distributed.init_process_group first, "
                           "or pass the group as the hook's state")
    return group


def _value(fut: torch.futures.Future) -> torch.Tensor:
    # The C++ future holds the bucket tensor; DDP's Python hook path needs a future of a Python object.
    return fut.value()


def allreduce_hook(process_group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket divided by the group size, then allreduced (DDP's behaviour without a hook)."""
    return _hooks.run_allreduce(_group(process_group), bucket).then(_value)


def fp16_compress_hook(process_group: dist.ProcessGroup,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Cast to float16 and divide by the group size (in place), allreduce, cast back into the bucket."""
    return _hooks.run_compress(_group(process_group), bucket, "fp16").then(_value)


def bf16_compress_hook(process_group: dist.ProcessGroup,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """As :func:`fp16_compress_hook` with bfloat16. Any backend with bfloat16 allreduce serves it (not only NCCL)."""
    return _hooks.run_compress(_group(process_group), bucket, "bf16").then(_value)


# DDP refuses hooks *named* bf16_compress_hook / bf16_compress_wrapper_hook unless NCCL is present (torch's are
# NCCL-only); ours run on any backend that reduces bfloat16, so they carry other names.
bf16_compress_hook.__name__ = "tunedist_bf16_compress_hook"


def _wrapper(dtype: torch.dtype, hook: Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]):
    def low_precision_wrapper_hook(hook_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        original = bucket.buffer()
        bucket.set_buffer(original.to(dtype))
        fut = hook(hook_state, bucket)

        def decompress(fut):
            result = fut.value()
            if result.dtype == original.dtype:
                original.copy_(result)
            else:
                _hooks.decompress_into(original, result)
            return original

        return fut.then(decompress)

    return low_precision_wrapper_hook


def fp16_compress_wrapper(hook):
    """Run ``hook`` on the bucket cast to float16 and cast its result back (torch's ``fp16_compress_wrapper``)."""
    wrapped = _wrapper(torch.float16, hook)
    wrapped.__name__ = wrapped.__qualname__ = "fp16_compress_wrapper_hook"
    return wrapped


def bf16_compress_wrapper(hook):
    """Run ``hook`` on the bucket cast to bfloat16 and cast its result back (torch's ``bf16_compress_wrapper``)."""
    wrapped = _wrapper(torch.bfloat16, hook)
    wrapped.__name__ = wrapped.__qualname__ = "tunedist_bf16_compress_wrapper_hook"
    return wrapped
