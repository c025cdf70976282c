"""Lightning's DDPStrategy over the `tuned` backend on CPU, with a tunedist DDP communication hook.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/clients/lightning_ddp.py \
        [--backend tuned|gloo] [--hook fp16|bf16|allreduce|none] [--hook-via callback|strategy] [--json out.json]

`DDPStrategy(process_group_backend="tuned")` is all it takes for the backend. The hook is another matter: Lightning
registers `DDPStrategy(ddp_comm_hook=...)` only when the root device is CUDA (lightning 2.6
`DDPStrategy._register_ddp_hooks`) and ignores it on CPU without a word. On CPU, a Callback registers it in
`on_fit_start`, which runs after the strategy has wrapped the model in DistributedDataParallel and before the first
step. `--hook-via strategy` passes the hook to DDPStrategy instead, to show that it is never called on CPU.

The hook is wrapped to count its calls. A tiny regression model trains for a few steps; each rank sees its own half
of the data (Lightning's DistributedSampler). Rank 0 prints, and with --json writes: the backend in use
(dist.get_backend()), the hook calls per rank, every rank's losses and every rank's final parameters (as floats, exact).
"""

from __future__ import annotations

import argparse
import functools
import json

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import tunedist  # registers the backend "tuned"
import tunedist.hooks

HOOKS = {
    "fp16": tunedist.hooks.default.fp16_compress_hook,
    "bf16": tunedist.hooks.default.bf16_compress_hook,
    "allreduce": tunedist.hooks.default.allreduce_hook,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="tuned", help="process_group_backend of DDPStrategy (default tuned)")
    p.add_argument("--hook", default="fp16", choices=[*HOOKS, "none"], help="tunedist.hooks.default hook")
    p.add_argument(
        "--hook-via",
        default="callback",
        choices=["callback", "strategy"],
        help="register the hook from a Callback (works on CPU) or pass it to DDPStrategy (CUDA only)",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", help="rank 0 writes the result here")
    return p.parse_args(argv)


def counting(hook):
    """`hook` wrapped to count its calls in `.calls` (functools.wraps keeps the name DDP's logger reads)."""

    @functools.wraps(hook)
    def counted(state, bucket):
        counted.calls += 1
        return hook(state, bucket)

    counted.calls = 0
    return counted


class RegisterCommHook(L.Callback):
    """Registers a DDP communication hook on CPU, where DDPStrategy(ddp_comm_hook=...) is not applied."""

    def __init__(self, hook):
        self.hook = hook

    def on_fit_start(self, trainer, pl_module):
        ddp = trainer.strategy.model  # DistributedDataParallel by now
        ddp.register_comm_hook(ddp.process_group, self.hook)


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Report(L.Callback):
    """Notes the DDP wrapper's group at fit start; gathers every rank's losses and parameters at fit end (over the
    default group, i.e. the backend under test)."""

    def __init__(self, counter):
        self.counter = counter
        self.wrapper = None
        self.result = None

    def on_fit_start(self, trainer, pl_module):
        ddp = trainer.strategy.model  # the strategy unwraps it again before on_fit_end
        self.wrapper = {"type": type(ddp).__name__, "group_backend": dist.get_backend(ddp.process_group)}

    def on_fit_end(self, trainer, pl_module):
        mine = {
            "rank": dist.get_rank(),
            "hook_calls": self.counter.calls if self.counter else 0,
            "losses": pl_module.losses,
            "params": {n: p.detach().double().flatten().tolist() for n, p in pl_module.named_parameters()},
        }
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        self.result = {
            "backend": dist.get_backend(),
            "world_size": dist.get_world_size(),
            "model_wrapper": self.wrapper,
            "ranks": ranks,
        }


def data(n=64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main(argv=None) -> None:
    args = parse_args(argv)
    L.seed_everything(0, verbose=False)
    counter = counting(HOOKS[args.hook]) if args.hook != "none" else None
    strategy_kw = {"ddp_comm_hook": counter} if counter and args.hook_via == "strategy" else {}
    callbacks = [RegisterCommHook(counter)] if counter and args.hook_via == "callback" else []
    report = Report(counter)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        max_steps=args.steps,
        strategy=DDPStrategy(process_group_backend=args.backend, **strategy_kw),
        callbacks=[*callbacks, report],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regression(), DataLoader(data(), batch_size=4))
    if trainer.global_rank == 0:
        result = {
            **report.result,
            "hook": args.hook,
            "hook_via": args.hook_via,
            "steps": args.steps,
            "lightning": L.__version__,
            "torch": torch.__version__,
        }
        calls = [r["hook_calls"] for r in result["ranks"]]
        print(
            f"backend {result['backend']}, hook {args.hook} via {args.hook_via}: calls per rank {calls}, "
            f"final losses {[r['losses'][-1] for r in result['ranks']]}"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    # Lightning leaves the process group to the process's exit, where a gloo group's threads may still run while
    # the interpreter tears down (one rank died with "terminate called without an active exception" in CI): end it.
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
