"""The linear scaling rule with a gradual warm-up (Goyal et al., 2017, "Accurate, Large Minibatch SGD").

When the global batch grows k-fold, multiply the learning rate by k:

    lr = base_lr x world_size x batch_per_device / base_batch      (k = global_batch / base_batch)

where base_lr is the rate tuned for base_batch samples per step. A large k makes the first steps unstable, so
the rate ramps linearly from base_lr to k x base_lr over a warm-up whose length grows with k:

    warmup_epochs = min(max_warmup_epochs, warmup_epochs_per_k x k)    (0 when k <= 1)

The defaults, 5/32 epoch per unit of k capped at 5 epochs, give Goyal et al.'s 5 epochs at k = 32 (8192 images
with base 256) and proportionally less below it. Both are parameters of :class:`ScalingRule`.

    rule = ScalingRule(world_size=8, batch_per_device=64, base_batch=256)   # k = 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)                  # base_lr: the rate for base_batch
    scheduler = LinearScalingLR(optimizer, rule, steps_per_epoch=len(loader))
    ... scheduler.step() after each optimizer.step()  (lr: 0.1 -> 0.2 over the warm-up, then 0.2)

LinearScalingLR is a torch LRScheduler: chain a decay after it with torch.optim.lr_scheduler.SequentialLR.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LRScheduler

GOYAL_WARMUP_EPOCHS = 5.0  # at k = 32 (Goyal et al., section 2.2)
GOYAL_K = 32


def scaled_lr(base_lr: float, world_size: int, batch_per_device: int, base_batch: int) -> float:
    """base_lr x world_size x batch_per_device / base_batch (the linear scaling rule)."""
    return base_lr * ScalingRule(world_size, batch_per_device, base_batch).k


@dataclass(frozen=True)
class ScalingRule:
    world_size: int
    batch_per_device: int
    base_batch: int
    warmup_epochs_per_k: float = GOYAL_WARMUP_EPOCHS / GOYAL_K
    max_warmup_epochs: float = GOYAL_WARMUP_EPOCHS

    def __post_init__(self) -> None:
        for name in ("world_size", "batch_per_device", "base_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"ScalingRule: {name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_epochs_per_k < 0 or self.max_warmup_epochs < 0:
            raise ValueError("ScalingRule: warm-up lengths must be >= 0")

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_per_device

    @property
    def k(self) -> float:
        """The factor on the learning rate: global batch / base batch."""
        return self.global_batch / self.base_batch

    @property
    def warmup_epochs(self) -> float:
        if self.k <= 1:
            return 0.0
        return min(self.max_warmup_epochs, self.warmup_epochs_per_k * self.k)

    def warmup_steps(self, steps_per_epoch: int) -> int:
        return round(self.warmup_epochs * steps_per_epoch)

    def factor(self, step: int, steps_per_epoch: int) -> float:
        """The multiplier on base_lr at optimizer step `step` (0-based): 1 -> k over the warm-up, then k."""
        warmup = self.warmup_steps(steps_per_epoch)
        if step >= warmup:
            return self.k
        return 1.0 + (self.k - 1.0) * step / warmup


class LinearScalingLR(LRScheduler):
    """Each param group's lr = its initial lr (the base_lr for base_batch) x rule.factor(step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, rule: ScalingRule, steps_per_epoch: int,
                 last_epoch: int = -1) -> None:
        if steps_per_epoch < 1:
            raise ValueError(f"LinearScalingLR: steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.rule = rule
        self.steps_per_epoch = steps_per_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = self.rule.factor(max(self.last_epoch, 0), self.steps_per_epoch)
        return [base * f for base in self.base_lrs]
