"""The main job's tensor-parallel decoding: a small transformer split over the ranks, greedy, batch 1.

Each layer is a parallel block (GPT-J's: x + attention(ln(x)) + mlp(ln(x))): the attention heads and the MLP's hidden
units are split over the ranks (column-parallel QKV and up-projection, row-parallel output and down-projection), and
the two row-parallel outputs are summed on each rank and all-reduced once, so every token costs one all_reduce per
layer of d_model fp32 values (2 KiB at d_model 512), as CPU serving stacks run tensor parallelism. The embeddings, the
final norm and the head are replicated. Weights come from one seeded generator and are sliced per rank.

The contenders differ only in the all_reduce they call:
- gloo:                 dist.all_reduce on a gloo group (the baseline);
- tuned dist.all_reduce: dist.all_reduce on the `tuned` world group;
- tunedist.all_reduce:  tunedist's operator on the same group (no torch.distributed Python layer per call);
- DeepSpeed:            deepspeed.comm.inference_all_reduce (its CPU shared-memory kernel), when DeepSpeed is
                        installed (pip install deepspeed, keeping this torch; it runs with DS_ACCELERATOR=cpu).
Rounds rotate the contenders' order; in each round every contender generates --tp-tokens tokens from the same prompt
after an untimed prefill, and before that the same generation with the all_reduce left out (its compute). A token's
time is its decode step on a rank, argmax included. Every contender must generate the same tokens (at 2 ranks a sum
of two fp32 values is exact in any order, so they must agree bit for bit).
"""

from __future__ import annotations

import importlib
import importlib.util
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import Samples, Timer, breakdown, everywhere, same_on_every_rank

import tunedist

GLOO, TUNED_C10D, TUNED_OP, DEEPSPEED = "gloo", "tuned dist.all_reduce", "tunedist.all_reduce", "DeepSpeed"


class TPModel:
    """This rank's slice of the model, as plain tensors (inference only)."""

    def __init__(self, args, rank: int, world: int):
        d, heads, layers, vocab = args.tp_d_model, args.tp_heads, args.tp_layers, args.tp_vocab
        if heads % world or (4 * d) % world or d % heads:
            raise ValueError(f"tp_decode: rank {rank}: {heads} heads, d_model {d} do not split over {world} ranks")
        self.d, self.hd, self.local_heads, self.max_len = d, d // heads, heads // world, args.tp_prompt + args.tp_tokens
        g = torch.Generator().manual_seed(args.seed + 7)

        def w(*shape, scale=0.02):
            return torch.randn(*shape, generator=g) * scale

        out_scale = 0.02 / math.sqrt(2 * layers)
        dl, fl = d // world, 4 * d // world
        self.emb, self.pos = w(vocab, d), w(self.max_len, d)
        self.layers = []
        for _ in range(layers):
            wq, wk, wv, wo = w(d, d), w(d, d), w(d, d), w(d, d, scale=out_scale)
            w1, w2 = w(4 * d, d), w(d, 4 * d, scale=out_scale)
            rows, hidden = slice(rank * dl, (rank + 1) * dl), slice(rank * fl, (rank + 1) * fl)
            self.layers.append({"ln_w": torch.ones(d), "ln_b": torch.zeros(d),
                                "wqkv": torch.cat([wq[rows], wk[rows], wv[rows]]).contiguous(),
                                "wo": wo[:, rows].contiguous(), "w1": w1[hidden].contiguous(),
                                "w2": w2[:, hidden].contiguous()})
        self.ln_w, self.ln_b, self.head = torch.ones(d), torch.zeros(d), w(vocab, d)

    def new_cache(self) -> list:
        shape = (self.local_heads, self.max_len, self.hd)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.layers]

    def forward(self, tokens: torch.Tensor, start: int, cache: list, all_reduce) -> torch.Tensor:
        """Next-token logits after `tokens` (1-D) placed at positions start..; fills the cache."""
        n, end = tokens.numel(), start + tokens.numel()
        x = self.emb[tokens] + self.pos[start:end]
        for layer, (k_cache, v_cache) in zip(self.layers, cache):
            h = F.layer_norm(x, (self.d,), layer["ln_w"], layer["ln_b"])
            q, k, v = (h @ layer["wqkv"].T).view(n, 3, self.local_heads, self.hd).permute(1, 2, 0, 3)
            k_cache[:, start:end], v_cache[:, start:end] = k, v
            attn = F.scaled_dot_product_attention(q, k_cache[:, :end], v_cache[:, :end], is_causal=n > 1)
            attn = attn.permute(1, 0, 2).reshape(n, -1) @ layer["wo"].T
            part = attn + F.gelu(h @ layer["w1"].T) @ layer["w2"].T  # this rank's share of the block's output
            all_reduce(part)  # the layer's one all_reduce: the shares summed over the ranks
            x = x + part
        return F.layer_norm(x[-1], (self.d,), self.ln_w, self.ln_b) @ self.head.T


def generate(model: TPModel, prompt: torch.Tensor, n: int, all_reduce, samples: list | None) -> list:
    """Greedy decoding of n tokens after an untimed prefill; appends each token's seconds to samples."""
    cache = model.new_cache()
    with torch.inference_mode():
        nxt = int(model.forward(prompt, 0, cache, all_reduce).argmax())
        out, pos = [nxt], prompt.numel()
        for _ in range(n - 1):
            clock = Timer()
            nxt = int(model.forward(torch.tensor([nxt]), pos, cache, all_reduce).argmax())
            if samples is not None:
                samples.append(clock.lap())
            out.append(nxt)
            pos += 1
    return out


def no_communication(t: torch.Tensor) -> None:
    pass


def _contenders():
    """The bench's DeepSpeed helpers: how it sets DeepSpeed up on CPU, and what DeepSpeed's API called."""
    return importlib.import_module("tunedist.bench.contenders")


def contenders(args, gloo_group, log) -> tuple[dict, dict]:
    """{name: all_reduce function} and what stands in DeepSpeed's way (or its facts)."""
    out = {GLOO: lambda t: dist.all_reduce(t, group=gloo_group),
           TUNED_C10D: lambda t: dist.all_reduce(t),
           TUNED_OP: lambda t: tunedist.all_reduce(t)}
    ds = {"used": False}
    if args.deepspeed == "off":
        ds["reason"] = "--deepspeed off"
        return out, ds
    if importlib.util.find_spec("deepspeed") is None:
        problem = "DeepSpeed is not installed"
    else:
        problem = _contenders().deepspeed_problem("cpu")  # sets DS_ACCELERATOR=cpu and LOCAL_SIZE, imports it
    if not everywhere(problem is None, gloo_group):
        ds["reason"] = problem or "DeepSpeed is unavailable on another rank"
        if args.deepspeed == "on":
            raise RuntimeError(f"tp_decode: --deepspeed on, but {ds['reason']}")
        return out, ds
    log("tp_decode: DeepSpeed is importable: deepspeed.init_distributed (its first run builds its shm op, minutes)")
    dscomm, info = _contenders().deepspeed_init()
    ds.update(used=True, **info)
    out[DEEPSPEED] = lambda t: dscomm.inference_all_reduce(t)
    return out, ds


def deepspeed_path(fn, model, prompt) -> dict:
    """What DeepSpeed's inference_all_reduce called during a short generation: its shm kernel or its fallback."""
    with _contenders().count_calls() as seen:
        generate(model, prompt, 2, fn, None)
    return {"kernel_calls": seen.kernel, "fallback_calls": seen.c10d}


def run(args, gloo_group, rank: int, world: int, log) -> dict:
    torch.manual_seed(args.seed)
    model = TPModel(args, rank, world)
    prompt = torch.randint(0, args.tp_vocab, (args.tp_prompt,), generator=torch.Generator().manual_seed(args.seed))
    fns, ds = contenders(args, gloo_group, log)
    if ds["used"]:
        ds.update(deepspeed_path(fns[DEEPSPEED], model, prompt))
    names = list(fns)
    times = {n: [] for n in names}
    compute = {n: [] for n in names}
    tokens = {n: [] for n in names}
    for name in names:  # warm-up: one short generation each
        generate(model, prompt, 4, fns[name], None)
    for r in range(args.tp_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            generate(model, prompt, args.tp_tokens, no_communication, compute[name])
            dist.barrier(group=gloo_group)  # the compute-only pass leaves the ranks apart
            tokens[name].append(generate(model, prompt, args.tp_tokens, fns[name], times[name]))
    out = {"model": {"kind": "parallel-block transformer, fp32", "d_model": args.tp_d_model,
                     "layers": args.tp_layers, "heads": args.tp_heads, "vocab": args.tp_vocab,
                     "prompt": args.tp_prompt, "batch": 1, "all_reduce_bytes": args.tp_d_model * 4,
                     "all_reduces_per_token": args.tp_layers},
           "tokens_per_generation": args.tp_tokens, "rounds": args.tp_rounds, "deepspeed": ds, "runs": []}
    for name in names:
        s = Samples()
        for t, c in zip(times[name], compute[name]):
            s.add(t, c)
        crit = s.critical(gloo_group)
        mean_ms = sum(crit["total_ms"]) / len(crit["total_ms"])
        role = "baseline" if name == GLOO else "other" if name == DEEPSPEED else "tunedist"
        out["runs"].append({"name": name, "role": role, "tokens_per_s": 1e3 / mean_ms,
                            "breakdown_ms": breakdown(crit), "samples_ms": crit, "generated": tokens[name][0]})
    reference = tokens[GLOO][0]
    same = all(g == reference for name in names for g in tokens[name])
    out["check"] = {"what": "generated token ids, every generation of every contender, on every rank",
                    "exact": True, "matched": everywhere(same, gloo_group) and
                    same_on_every_rank(reference, gloo_group), "generations_compared": sum(map(len,
                                                                                                tokens.values()))}
    return out
