"""Train a small transformer language model with DistributedDataParallel on CPU, over the `tuned` backend or gloo.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --backend tuned
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --backend gloo --json gloo.json

Everything is synthetic and seeded, so no download is needed and both backends see the same model and data: tokens
follow a fixed random Markov chain (each token has a few likely successors), which the model learns within a few
dozen steps. DDP all-reduces the gradients (about 2.1 M parameters, 8.5 MB in float32) through the chosen backend.

Rank 0 prints the loss now and then and, at the end, one line `... <X> samples/s ...` (global samples per second over
the timed steps, which exclude the first --warmup-steps), the mean step time and the final loss; `./dev main` reads
the samples/s of that line. --json also writes these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="tuned", help="c10d backend for the gradients (default tuned; or gloo)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--warmup-steps", type=int, default=3, help="first steps left out of the timing (default 3)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step (default 8)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size (default 25)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads per rank (default: OMP_NUM_THREADS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", help="rank 0 writes the results here")
    args = p.parse_args(argv)
    if args.steps <= args.warmup_steps:
        p.error(f"--steps ({args.steps}) must exceed --warmup-steps ({args.warmup_steps})")
    return args


class TinyLM(nn.Module):
    """Token and position embeddings, a causal pre-norm transformer encoder and a linear head."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        x = self.encoder(x, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(self.norm(x))


class MarkovData:
    """Sequences from a fixed random Markov chain: each token is followed by one of 4 successors (seeded)."""

    def __init__(self, vocab: int, seq_len: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.vocab, self.seq_len = vocab, seq_len
        self.successors = torch.randint(0, vocab, (vocab, 4), generator=g)
        self.weights = torch.tensor([0.55, 0.25, 0.15, 0.05])

    def batch(self, batch_size: int, step: int, rank: int, seed: int) -> torch.Tensor:
        """The batch of (step, rank): seeded by both, so every run and backend sees the same data."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch_size,), generator=g)
        choice = torch.multinomial(self.weights, batch_size * self.seq_len, replacement=True, generator=g)
        choice = choice.view(batch_size, self.seq_len)
        for t in range(self.seq_len):
            tokens[:, t + 1] = self.successors[tokens[:, t], choice[:, t]]
        return tokens


def train(args, rank: int, world: int) -> dict:
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = MarkovData(args.vocab, args.seq_len, args.seed)
    step_times, losses = [], []
    for step in range(args.steps):
        tokens = data.batch(args.batch_size, step, rank, args.seed)
        start = time.perf_counter()
        logits = ddp(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets here, overlapped with the backward pass
        opt.step()
        step_times.append(time.perf_counter() - start)
        # The mean loss over ranks, for the log only: outside the timed region.
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step + 1:4d}/{args.steps}  loss {losses[-1]:.4f}  step {step_times[-1] * 1e3:.1f} ms",
                  flush=True)
    timed = step_times[args.warmup_steps:]
    # A step ends when the slowest rank's gradients are in, so every rank's step time is about the same; take the max.
    mean_step = torch.tensor(sum(timed) / len(timed), dtype=torch.float64)
    dist.all_reduce(mean_step, op=dist.ReduceOp.MAX)
    mean_step_s = mean_step.item()
    return {"backend": args.backend, "world_size": world, "steps": args.steps, "timed_steps": len(timed),
            "batch_size": args.batch_size, "seq_len": args.seq_len, "parameters": n_params,
            "grad_bytes": n_params * 4, "samples_per_s": world * args.batch_size / mean_step_s,
            "mean_step_ms": mean_step_s * 1e3, "final_loss": losses[-1], "first_loss": losses[0],
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__}


def main(argv=None) -> int:
    args = parse_args(argv)
    if "tuned" in args.backend:
        import tunedist  # noqa: F401  (registers the "tuned" backend)
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = train(args, rank, world)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"backend {result['backend']}  world_size {world}  {result['samples_per_s']:.1f} samples/s  "
              f"mean step {result['mean_step_ms']:.1f} ms  final loss {result['final_loss']:.4f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
