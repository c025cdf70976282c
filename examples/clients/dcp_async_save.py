"""torch.distributed.checkpoint.async_save while training goes on over the `tuned` backend.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/clients/dcp_async_save.py \
        [--ckpt-backend gloo|tuned] [--ckpt-dir DIR] [--json out.json]

`dcp.async_save` runs the save, with its collectives (plan gather, metadata scatter, final barrier), in a thread of
its own. On the group that training uses, those collectives interleave with the training ones in an order no rank
agrees on: that races on every backend. The fix torch documents is a separate process group for checkpointing,
passed as `process_group=` to async_save and load. Here training runs on the default `tuned` group and the
checkpoint on `dist.new_group(backend="gloo")`, or with --ckpt-backend tuned on a second tuned group.

Steps: train a few DDP steps; async_save the model and optimizer state (get_state_dict) and keep a copy of it; go
on training while the save runs, each step also checking an all_reduce and an all_gather whose results are known;
wait the future; load the checkpoint into a fresh model and optimizer and compare with the copy, bit for bit.
Rank 0 prints, and with --json writes, the result.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_flatten, tree_map

import tunedist  # noqa: F401  # registers the backend "tuned"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--ckpt-backend",
        default="gloo",
        choices=["gloo", "tuned"],
        help="backend of the checkpoint's own process group (default gloo)",
    )
    p.add_argument("--ckpt-dir", help="checkpoint directory (default: a temporary one, removed at the end)")
    p.add_argument("--steps-before", type=int, default=3, help="training steps before the save")
    p.add_argument("--steps-during", type=int, default=6, help="training steps between async_save and its wait")
    p.add_argument("--json", help="rank 0 writes the result here")
    return p.parse_args(argv)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 8))


def train_step(model, optimizer, step: int) -> bool:
    """One DDP step on this rank's own batch, then an all_reduce and an all_gather with known results."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    summed = torch.full((4096,), float(rank + 1) * (step + 1))
    dist.all_reduce(summed)
    gathered = torch.empty(world * 1000)
    dist.all_gather_into_tensor(gathered, torch.full((1000,), float(rank * 100 + step)))
    expected = torch.arange(world, dtype=torch.float32).mul(100).add(step).repeat_interleave(1000)
    return bool(torch.all(summed == world * (world + 1) / 2 * (step + 1))) and torch.equal(gathered, expected)


def state_of(model, optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def same(a: dict, b: dict) -> bool:
    leaves_a, spec_a = tree_flatten(a)
    leaves_b, spec_b = tree_flatten(b)
    if spec_a != spec_b:
        return False
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(leaves_a, leaves_b))


def flat_params(model) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist()


def run(args, ckpt_dir: str, ckpt_group) -> dict:
    model = DistributedDataParallel(make_model(seed=0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    checks = [train_step(model, optimizer, step) for step in range(args.steps_before)]

    state = state_of(model, optimizer)
    saved = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, state)
    future = dcp.async_save(state, checkpoint_id=ckpt_dir, process_group=ckpt_group)
    pending = []  # whether the save was still running as each step began (depends on timing: not checked)
    for step in range(args.steps_before, args.steps_before + args.steps_during):
        pending.append(not future.done())
        checks.append(train_step(model, optimizer, step))
    future.result()  # the save's Metadata, or its exception
    live = state_of(model, optimizer)

    fresh = DistributedDataParallel(make_model(seed=1))
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    loaded = state_of(fresh, fresh_optimizer)  # the structure to load into (get_state_dict initialises Adam's state)
    dcp.load(loaded, checkpoint_id=ckpt_dir, process_group=ckpt_group)
    loaded_equals_saved = same(loaded, saved)  # before set_state_dict, which rewrites `loaded` in place
    set_state_dict(fresh, fresh_optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    return {
        "rank": dist.get_rank(),
        "collective_checks": checks,
        "steps_started_while_saving": sum(pending),
        "loaded_equals_saved": loaded_equals_saved,
        "restored_model_equals_saved": same(state_of(fresh, fresh_optimizer), saved),
        "live_differs_from_saved": not same(live, saved),
        "params": flat_params(model),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    dist.init_process_group("tuned")  # training
    ckpt_group = dist.new_group(backend=args.ckpt_backend)  # checkpointing: its collectives never meet training's
    rank = dist.get_rank()
    made = [None]
    if rank == 0:
        made[0] = args.ckpt_dir or tempfile.mkdtemp(prefix="dcp_async_save_")
    dist.broadcast_object_list(made, src=0)
    ckpt_dir = made[0]
    try:
        mine = run(args, ckpt_dir, ckpt_group)
    finally:
        dist.barrier()
        if rank == 0 and args.ckpt_dir is None:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        result = {
            "backend": dist.get_backend(),
            "ckpt_backend": dist.get_backend(ckpt_group),
            "steps_before": args.steps_before,
            "steps_during": args.steps_during,
            "torch": torch.__version__,
            "ranks": ranks,
        }
        print(json.dumps({**result, "ranks": [{k: v for k, v in r.items() if k != "params"} for r in ranks]}))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
