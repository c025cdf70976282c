"""Hugging Face Accelerate on CPU over the `tuned` backend.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/clients/accelerate_cpu.py \
        [--init tuned|kwargs|tuned-without-cpu] [--json out.json]

Accelerate picks the CPU backend itself: with `Accelerator(cpu=True)` it is gloo (mpi when torch has it), and
`InitProcessGroupKwargs(backend="tuned")` raises "Your assigned backend tuned is not available, please use gloo"
(accelerate 1.16 `PartialState.__init__` and `_prepare_backend`). It creates a process group only when none
exists, though, so `dist.init_process_group("tuned")` before `Accelerator(cpu=True)` makes it use `tuned`:
`prepare()` wraps the model in DistributedDataParallel over the default group, and `accelerator.gather` and
`reduce` run on it. `accelerator.state.backend` still says "gloo"; `dist.get_backend()` says what runs.
`cpu=True` is needed: on a machine without an accelerator, plain `Accelerator()` ignores the existing group and
runs as one process (DistributedType.NO, num_processes 1, no DDP), so each rank would train alone.

`--init tuned` (default) trains a tiny regression model that way; each rank gets its own shard of the data from
the prepared DataLoader. `--init kwargs` only tries InitProcessGroupKwargs(backend="tuned") and reports what
happened. `--init tuned-without-cpu` creates the tuned group, then `Accelerator()` without cpu=True, and reports
what Accelerate made of it. Rank 0 prints, and with --json writes, the result.
"""

from __future__ import annotations

import argparse
import json
import os

import accelerate
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, InitProcessGroupKwargs
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import tunedist  # noqa: F401  # registers the backend "tuned"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--init",
        default="tuned",
        choices=["tuned", "kwargs", "tuned-without-cpu"],
        help="tuned: dist.init_process_group('tuned') before Accelerator(cpu=True); "
        "kwargs: Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend='tuned')]); "
        "tuned-without-cpu: dist.init_process_group('tuned') before Accelerator()",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", help="rank 0 writes the result here")
    return p.parse_args(argv)


def try_init_kwargs() -> dict:
    """What Accelerate does with InitProcessGroupKwargs(backend="tuned") on CPU."""
    try:
        accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="tuned")])
    except ValueError as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "state_backend": accelerator.state.backend, "backend": dist.get_backend()}


def try_without_cpu() -> dict:
    """What Accelerate makes of an existing tuned group when cpu=True is not given."""
    dist.init_process_group("tuned")
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(2, 2))
    return {
        "backend": dist.get_backend(),
        "state_backend": accelerator.state.backend,
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "model_wrapper": type(model).__name__,
    }


def data(n=64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(torch.arange(n), x, y)


def train(steps: int) -> dict:
    dist.init_process_group("tuned")  # first: Accelerate keeps a process group that exists
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    initial = torch.cat([p.detach().flatten() for p in model.parameters()])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, seen = [], []
    for _, (idx, x, y) in zip(range(steps), loader):
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        seen += idx.tolist()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    every_params = accelerator.gather(params[None])  # (ranks, n), over the default group
    every_seen = accelerator.gather(torch.tensor(seen)[None])
    every_loss = accelerator.gather(torch.tensor(losses, dtype=torch.float64)[None])
    mean_loss = accelerator.reduce(torch.tensor(losses[-1], dtype=torch.float64), reduction="mean")
    result = {
        "backend": dist.get_backend(),
        "state_backend": accelerator.state.backend,
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "model_wrapper": type(model).__name__,
        "ddp_group_backend": dist.get_backend(model.process_group)
        if isinstance(model, DistributedDataParallel)
        else None,
        "params_changed": not torch.equal(initial, params),
        "ranks_params": every_params.double().tolist(),
        "ranks_sample_indices": every_seen.tolist(),
        "ranks_losses": every_loss.tolist(),
        "reduced_mean_last_loss": mean_loss.item(),
    }
    accelerator.end_training()  # also destroys the process group
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = {"tuned": lambda: train(args.steps), "kwargs": try_init_kwargs, "tuned-without-cpu": try_without_cpu}
    result = runs[args.init]()
    result = {"init": args.init, "accelerate": accelerate.__version__, "torch": torch.__version__, **result}
    if os.environ["RANK"] == "0":
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("ranks_")}))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
