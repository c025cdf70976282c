"""Workers of starved_exit.py: DDP over gloo with a comm hook while the rank's other threads are starved."""

import os

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from hooks_state_workers import RecordingGroup, td_default, td_hooks, train


def renice_other_threads() -> None:
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)


def starved(rank: int, world: int, label: str) -> int:
    label = label.removesuffix("@tuned")
    group = RecordingGroup(dist.group.WORLD)

    def install(ddp):
        renice_other_threads()
        if label == "dropin":
            ddp.register_comm_hook(group, td_default.fp16_compress_hook)
        elif label == "torch":
            ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
        elif label == "torch_world":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            td_hooks.register(ddp, "fp16", process_group=group)

    train(rank, None, install, steps=6, ddp_kwargs={"bucket_cap_mb": 0.02})
    return 0
