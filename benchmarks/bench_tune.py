"""The bucket autotuner against an exhaustive sweep of the same candidates, in one run (tunedist.tune).

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_tune.py --backend tuned --json tune.json

For each model: the sweep measures a DDP step at every candidate (and DDP's default), the tuner picks one; both
run --rounds times, alternating which goes first and reversing the sweep's order each round, to cancel drift.
Reported per model: worst/best of the sweep (how much bucketing matters here), the tuner's choice against the
sweep's best (its step time measured in the sweep, and again head to head with the best after the rounds), the
tuner's time against the sweep's, and the choice against DDP's default. Targets: worst/best >= 1.2, choice within 5% of the best, tuner <= 25% of the sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import tunedist  # noqa: F401  (registers "tuned")
from tunedist import tune


class DeepMLP(torch.nn.Module):
    """Many mid-size layers: a cap below a layer gives a bucket per tensor, a cap above the model one bucket."""

    def __init__(self, width: int = 256, depth: int = 96, batch: int = 32):
        super().__init__()
        self.layers = torch.nn.Sequential(*[m for _ in range(depth) for m in (torch.nn.Linear(width, width),
                                                                             torch.nn.Tanh())])
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)

    def loss(self, model):
        return torch.nn.functional.mse_loss(model(self.x), self.y)

    def forward(self, x):
        return self.layers(x)


class SlowFirstWide(torch.nn.Module):
    """A compute-heavy first block over many tokens (small parameters, slow backward, its gradients ready last),
    then a few huge layers on the pooled tokens (most of the bytes, ready early)."""

    def __init__(self, d: int = 256, tokens: int = 4096, hidden: int = 3072):
        super().__init__()
        self.token_mlp = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d),
                                             torch.nn.GELU())
        self.head = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                        torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                        torch.nn.Linear(hidden, d))
        g = torch.Generator().manual_seed(2)
        self.x, self.y = torch.randn(4, tokens // 4, d, generator=g), torch.randn(4, d, generator=g)

    def loss(self, model):
        return torch.nn.functional.mse_loss(model(self.x), self.y)

    def forward(self, x):
        return self.head(self.token_mlp(x).mean(dim=1))


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyTransformer(torch.nn.Module):
    """Mixed sizes, as in a language model: an embedding table used first (its gradient ready last), blocks of
    mid-size matrices and many tiny LayerNorm/bias tensors."""

    def __init__(self, vocab: int = 8192, d: int = 256, depth: int = 8, heads: int = 4, batch: int = 2,
                 seq: int = 32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.Sequential(*[Block(d, heads) for _ in range(depth)])
        self.head = torch.nn.Linear(d, vocab // 16)
        g = torch.Generator().manual_seed(3)
        self.x = torch.randint(0, vocab, (batch, seq), generator=g)
        self.y = torch.randint(0, vocab // 16, (batch * seq,), generator=g)

    def loss(self, model):
        return torch.nn.functional.cross_entropy(model(self.x).reshape(-1, self.head.out_features), self.y)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


class EmbeddingTables(torch.nn.Module):
    """A recommendation model's shape: many embedding tables (dense gradients, 128 KiB each) looked up first, under
    a small MLP. The tables' gradients are all ready at the very end of the backward, so there is little to overlap
    and the bucket count is what costs: each bucket is one more collective and one more wait."""

    def __init__(self, tables: int = 128, rows: int = 1024, dim: int = 32, batch: int = 64, hidden: int = 256):
        super().__init__()
        self.tables = torch.nn.ModuleList(torch.nn.Embedding(rows, dim) for _ in range(tables))
        self.top = torch.nn.Sequential(torch.nn.Linear(tables * dim, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        g = torch.Generator().manual_seed(5)
        self.x = torch.randint(0, rows, (tables, batch), generator=g)
        self.y = torch.randn(batch, 1, generator=g)

    def loss(self, model):
        return torch.nn.functional.mse_loss(model(self.x), self.y)

    def forward(self, x):
        return self.top(torch.cat([table(i) for table, i in zip(self.tables, x)], dim=1))


MODELS = {"deep_mlp": DeepMLP, "transformer": TinyTransformer, "slow_first_wide": SlowFirstWide,
          "embedding_tables": EmbeddingTables}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="tuned")
    p.add_argument("--models", default="deep_mlp,embedding_tables")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="timed steps per candidate (sweep and tuner alike)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _sweep(model, candidates, opts, reverse: bool):
    order = candidates[::-1] if reverse else candidates
    # All candidates in turns in one go: a candidate left over for a chunk of its own would be timed under
    # another load than the rest.
    opts = dataclasses.replace(opts, interleave=len(order))
    t0 = time.perf_counter()
    timings = tune.measure_candidates(model, order, model.loss, None, options=opts)
    return {c: t for c, t in zip(order, timings)}, time.perf_counter() - t0


def _tuner(model, candidates, opts):
    t0 = time.perf_counter()
    report = tune.tune(model, model.loss, options=opts)
    return report, time.perf_counter() - t0


def _head_to_head(model, candidates, opts, args) -> dict:
    """The sweep's best against the tuner's choices again, in turns, as many steps each as the sweep gave it: the
    sweep's best is the least of many noisy times, so the sweep alone flatters it (the winner's curse)."""
    opts = dataclasses.replace(opts, trial_steps=args.steps * args.rounds, interleave=len(candidates))
    timings = tune.measure_candidates(model, candidates, model.loss, None, options=opts)
    return {c: t.median_s for c, t in zip(candidates, timings)}


def bench_model(name: str, args) -> dict:
    torch.manual_seed(0)
    model = MODELS[name]()
    candidates = tune.make_candidates(tune.measure.model_bytes(model), first_mb=(1.0,))
    sweep_set = candidates + [tune.Candidate(None)]
    opts = tune.TuneOptions(candidates=candidates, top_k=args.top_k, measure_default=False,
                            trial_steps=args.steps, progress=not args.no_progress)
    sweeps, sweep_s, reports, tuner_s = [], [], [], []
    for rnd in range(args.rounds):
        for first in (("sweep", "tuner") if rnd % 2 == 0 else ("tuner", "sweep")):
            if first == "sweep":
                s, secs = _sweep(model, sweep_set, opts, reverse=rnd % 2 == 1)
                sweeps.append(s)
                sweep_s.append(secs)
            else:
                r, secs = _tuner(model, candidates, opts)
                reports.append(r)
                tuner_s.append(secs)
    med = {c: statistics.median(s[c].median_s for s in sweeps) for c in sweep_set}
    tuned_only = {c: v for c, v in med.items() if not c.is_default}
    best = min(tuned_only, key=tuned_only.get)
    worst = max(tuned_only, key=tuned_only.get)
    default = med[tune.Candidate(None)]
    choices = [r.choice for r in reports]
    head_to_head = _head_to_head(model, [best] + [c for c in dict.fromkeys(choices) if c != best], opts, args)
    return {
        "model": name, "model_bytes": tune.measure.model_bytes(model), "tensors": len(tune.params_of(model)),
        "candidates": len(candidates),
        "sweep_ms": {c.label: med[c] * 1e3 for c in sweep_set},
        "sweep_runs_ms": [{c.label: s[c].median_s * 1e3 for c in sweep_set} for s in sweeps],
        "best": best.label, "best_ms": med[best] * 1e3, "worst": worst.label, "worst_ms": med[worst] * 1e3,
        "worst_over_best": med[worst] / med[best], "default_ms": default * 1e3,
        "choices": [c.label for c in choices],
        "choice_over_best": [med[c] / med[best] for c in choices],
        "choice_over_best_head_to_head": [head_to_head[c] / head_to_head[best] for c in choices],
        "default_over_choice": [default / med[c] for c in choices],
        "tuner_s": tuner_s, "sweep_s": sweep_s,
        "tuner_over_sweep": statistics.mean(tuner_s) / statistics.mean(sweep_s),
        "reports": [r.as_dict() for r in reports], "table": reports[-1].table(),
    }


def print_result(res: dict) -> None:
    print(f"\n## {res['model']}: {res['model_bytes'] / 2**20:.1f} MiB in {res['tensors']} tensors, "
          f"{res['candidates']} candidates")
    print(res["table"])
    print(f"#{'sweep candidate':>30} {'step ms (median of rounds)':>28}  per round")
    for label, ms in sorted(res["sweep_ms"].items(), key=lambda kv: kv[1]):
        runs = " ".join(f"{r[label]:8.1f}" for r in res["sweep_runs_ms"])
        marks = (" <- best" if label == res["best"] else "") + (" <- worst" if label == res["worst"] else "") + \
            (" <- tuner" if label in res["choices"] else "")
        print(f"{label:>31} {ms:>28.2f}  {runs}{marks}")
    print(f"# worst/best {res['worst_over_best']:.2f} (target >= 1.2); tuner choice/best "
          f"{', '.join(f'{x:.3f}' for x in res['choice_over_best'])} (target <= 1.05; head to head "
          f"{', '.join(f'{x:.3f}' for x in res['choice_over_best_head_to_head'])}); tuner time/sweep time "
          f"{res['tuner_over_sweep']:.2f} ({', '.join(f'{s:.1f}' for s in res['tuner_s'])} s vs "
          f"{', '.join(f'{s:.1f}' for s in res['sweep_s'])} s; target <= 0.25); default/choice "
          f"{', '.join(f'{x:.2f}' for x in res['default_over_choice'])}")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name, args))
        if dist.get_rank() == 0:
            print_result(results[-1])
            sys.stdout.flush()
    if dist.get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "world_size": dist.get_world_size(), "torch": torch.__version__,
                       "rounds": args.rounds, "steps": args.steps, "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
