"""tunedist's main job: one DDP training, run twice side by side in one torchrun — tunedist against torch's default.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py \
        [--json build/main_job.json] [--plot build/main_job.png]

A small transformer language model learns synthetic, seeded data (a fixed random Markov chain: each token has a few
likely successors), so nothing is downloaded and both runs see the same model and batches:

- "gloo + default DDP": the baseline most CPU jobs use: DDP over gloo with the default 25 MB buckets, no hook.
- "tuned + tunedist": DDP over the `tuned` backend (shared memory on one host; NCCL for CUDA tensors), with bucket
  sizes chosen by tunedist.tune on this job, and a tunedist C++ hook (the one the tuner advises, else the native
  all_reduce hook).

The two models train in alternating steps, so load changes on the machine hit both alike. Rank 0 prints, for each:
samples/s, mean step time, exposed communication (the forward+backward time minus the same without communication,
measured with DDP's no_sync on the same batches) and the final loss; `--json` and `--plot` save the record.
CPU by default; on a machine with a GPU (or --device cuda) each rank uses its own GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps of each run (default 40)")
    p.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the timing (default 5)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step (default 8)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hook", default="auto",
                   help="tunedist hook of the tuned run: auto (the tuner's advice, else the native all_reduce "
                        "hook), allreduce, fp16, bf16, powersgd or none")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, help="torch.set_num_threads per rank (default: torch's choice)")
    p.add_argument("--no-sync-steps", type=int, default=5, help="steps measured without communication (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--json", help="rank 0 writes the record here")
    p.add_argument("--plot", help="rank 0 draws loss and step-time breakdown here (needs matplotlib)")
    args = p.parse_args(argv)
    if args.steps <= args.warmup_steps:
        p.error(f"--steps ({args.steps}) must exceed --warmup-steps ({args.warmup_steps})")
    if args.hook not in ("auto", "allreduce", "fp16", "bf16", "powersgd", "none"):
        p.error(f"--hook {args.hook!r}: choose auto, allreduce, fp16, bf16, powersgd or none")
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
        """The batch of (step, rank): seeded by both, so both runs see the same data."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch_size,), generator=g)
        choice = torch.multinomial(self.weights, batch_size * self.seq_len, replacement=True, generator=g)
        choice = choice.view(batch_size, self.seq_len)
        for t in range(self.seq_len):
            tokens[:, t + 1] = self.successors[tokens[:, t], choice[:, t]]
        return tokens


@dataclass
class Run:
    """One configuration: its DDP model, optimizer and what was measured."""

    name: str
    ddp: DDP
    opt: torch.optim.Optimizer
    setup: dict
    step_s: list = field(default_factory=list)
    fwd_bwd_s: list = field(default_factory=list)
    no_sync_fwd_bwd_s: list = field(default_factory=list)
    losses: list = field(default_factory=list)


def lm_loss(model: nn.Module, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(run: Run, tokens: torch.Tensor, vocab: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    loss = lm_loss(run.ddp, tokens, vocab)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP all-reduces the gradient buckets here, overlapped with the backward pass
    sync(device)
    fwd_bwd = time.perf_counter() - start
    run.opt.step()
    sync(device)
    run.step_s.append(time.perf_counter() - start)
    run.fwd_bwd_s.append(fwd_bwd)
    return loss.detach()


def compute_only_step(run: Run, tokens: torch.Tensor, vocab: int, device: torch.device) -> None:
    """Forward + backward without any communication (DDP's no_sync); the gradients are thrown away."""
    sync(device)
    start = time.perf_counter()
    with run.ddp.no_sync():
        loss = lm_loss(run.ddp, tokens, vocab)
        loss.backward()
    sync(device)
    run.no_sync_fwd_bwd_s.append(time.perf_counter() - start)
    run.opt.zero_grad(set_to_none=True)


def build_model(args, device: torch.device) -> nn.Module:
    torch.manual_seed(args.seed)  # the same initial weights in both runs and on every rank
    return TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(device)


def make_baseline(args, device: torch.device, gloo_group) -> Run:
    model = build_model(args, device)
    ddp = DDP(model, process_group=gloo_group, device_ids=[device.index] if device.type == "cuda" else None)
    return Run("gloo + default DDP", ddp, torch.optim.AdamW(ddp.parameters(), lr=args.lr),
               {"backend": "gloo", "bucket_cap_mb": 25, "hook": None})


def make_tuned(args, device: torch.device, data: MarkovData, rank: int) -> tuple[Run, object]:
    import tunedist.tune

    model = build_model(args, device)
    tune_batch = data.batch(args.batch_size, -1, rank, args.seed).to(device)  # a batch neither run trains on
    hook = None if args.hook in ("auto", "none") else args.hook
    ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    t0 = time.perf_counter()
    ddp, report = tunedist.tune.ddp(model, step_fn=lambda m: lm_loss(m, tune_batch, args.vocab), hook=hook,
                                    **ddp_kwargs)
    if args.hook == "auto":
        # The tuner's advice where communication stays exposed; otherwise the native all_reduce hook (C++, no
        # Python per bucket).
        hook = report.advice[0]["hook"] if report.advice else "allreduce"
        import tunedist.hooks

        tunedist.hooks.register(ddp, hook)
    tune_s = time.perf_counter() - t0
    setup = {"backend": "tuned", "bucket_cap_mb": report.choice.cap_mb, "first_bucket_mb": report.choice.first_mb,
             "choice": report.choice.label, "hook": hook, "tune_s": tune_s}
    return Run("tuned + tunedist", ddp, torch.optim.AdamW(ddp.parameters(), lr=args.lr), setup), report


def summarise(run: Run, args, world: int, group) -> dict:
    def agreed_mean(values: list) -> float:
        # Every rank waits for the slowest at the end of a step: take the slowest rank's mean.
        t = torch.tensor(statistics.fmean(values), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.item()

    timed = slice(args.warmup_steps, None)
    step = agreed_mean(run.step_s[timed])
    fwd_bwd = agreed_mean(run.fwd_bwd_s[timed])
    compute = agreed_mean(run.no_sync_fwd_bwd_s)
    return {"name": run.name, **run.setup, "samples_per_s": world * args.batch_size / step,
            "mean_step_ms": step * 1e3, "fwd_bwd_ms": fwd_bwd * 1e3, "compute_fwd_bwd_ms": compute * 1e3,
            "exposed_comm_ms": max(0.0, fwd_bwd - compute) * 1e3, "final_loss": run.losses[-1],
            "first_loss": run.losses[0], "losses": run.losses}


def main(argv=None) -> int:
    args = parse_args(argv)
    import tunedist  # noqa: F401  (registers the "tuned" backend)

    if args.threads:
        torch.set_num_threads(args.threads)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("tuned")
    gloo_group = dist.new_group(backend="gloo")  # the baseline's group; also carries the log-only reductions
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        data = MarkovData(args.vocab, args.seq_len, args.seed)
        tuned, report = make_tuned(args, device, data, rank)
        if rank == 0:
            print(report.table(), flush=True)
        runs = [make_baseline(args, device, gloo_group), tuned]
        for step in range(args.steps):
            tokens = data.batch(args.batch_size, step, rank, args.seed).to(device)
            for run in runs if step % 2 == 0 else reversed(runs):
                loss = train_step(run, tokens, args.vocab, device)
                dist.all_reduce(loss, group=gloo_group)  # the mean loss over ranks, for the log only
                run.losses.append(loss.item() / world)
            if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                print(f"step {step + 1:4d}/{args.steps}  " + "  ".join(
                    f"[{r.name}] loss {r.losses[-1]:.4f} step {r.step_s[-1] * 1e3:.1f} ms" for r in runs),
                    flush=True)
        for i in range(args.no_sync_steps):
            tokens = data.batch(args.batch_size, args.steps + i, rank, args.seed).to(device)
            for run in runs:
                compute_only_step(run, tokens, args.vocab, device)
        results = [summarise(run, args, world, gloo_group) for run in runs]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        record = {"world_size": world, "device": device.type, "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "args": vars(args), "runs": results,
                  "tune": report.as_dict()}
        print_summary(results)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        if args.plot:
            plot(results, args.plot)
    return 0


def print_summary(results: list) -> None:
    print(f"\n{'run':<22}{'samples/s':>11}{'step ms':>10}{'exposed comm ms':>17}{'final loss':>12}  setup")
    for r in results:
        setup = f"backend {r['backend']}, buckets {r.get('choice', '25 MB (default)')}, hook {r['hook']}"
        print(f"{r['name']:<22}{r['samples_per_s']:>11.1f}{r['mean_step_ms']:>10.1f}{r['exposed_comm_ms']:>17.1f}"
              f"{r['final_loss']:>12.4f}  {setup}")
    base, ours = results
    print(f"tuned / gloo: {ours['samples_per_s'] / base['samples_per_s']:.2f}x samples/s", flush=True)


def plot(results: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        ax_loss.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["name"])
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (mean over ranks)")
    ax_loss.legend()
    names = [r["name"] for r in results]
    compute = [r["compute_fwd_bwd_ms"] for r in results]
    exposed = [r["exposed_comm_ms"] for r in results]
    rest = [max(0.0, r["mean_step_ms"] - r["compute_fwd_bwd_ms"] - r["exposed_comm_ms"]) for r in results]
    ax_time.bar(names, compute, label="forward + backward compute")
    ax_time.bar(names, exposed, bottom=compute, label="exposed communication")
    ax_time.bar(names, rest, bottom=[c + e for c, e in zip(compute, exposed)], label="optimizer step")
    for i, r in enumerate(results):
        ax_time.text(i, r["mean_step_ms"], f"{r['samples_per_s']:.0f} samples/s", ha="center", va="bottom")
    ax_time.set_ylabel("mean step time (ms)")
    ax_time.legend(loc="lower right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
