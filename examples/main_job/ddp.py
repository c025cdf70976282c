"""The main job's DDP workload: examples/train_ddp.py's transformer trained twice, step by step in alternation.

- baseline: gloo + default DDP (25 MB buckets, no hook), what most CPU jobs run;
- tunedist: DDP over `tuned` with the bucket sizes tunedist.tune chose on this job and the hook it advises (the
  native C++ all_reduce hook where no compression pays).
The model, the data and both setups are examples/train_ddp.py's (that file stays the one-file example of the same
training); this module adds the interleaved measurement. Each step of each run is a sample: compute is the DDP
module's forward+backward under no_sync on the same batch just before the step, exposed communication the step's
forward+backward beyond it, optimizer the AdamW step. Both runs start from the same weights and see the same
batches; their losses must be equal (exactly, with a lossless hook: at 2 ranks a sum of two values is exact in any
order and the division by 2 too).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import train_ddp  # examples/train_ddp.py (run.py puts examples/ on sys.path)
from common import Samples, Timer, breakdown, everywhere

LOSSLESS_HOOKS = (None, "allreduce")


def ddp_args(args) -> object:
    """train_ddp's arguments for the main job's run: its model and batch, our step counts."""
    argv = ["--steps", str(args.ddp_steps + args.ddp_warmup), "--warmup-steps", str(args.ddp_warmup),
            "--seed", str(args.seed), "--lr", str(args.lr)]
    if args.quick:  # a model small enough that the tuner's probes take a second
        argv += ["--vocab", "256", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "8",
                 "--batch-size", "2"]
    return train_ddp.parse_args(argv)


def timed_step(run, tokens, targs) -> tuple[float, float, float, torch.Tensor]:
    """(total, compute, optimizer) seconds and the loss of one step of `run`, after its no-communication twin."""
    clock = Timer()
    with run.ddp.no_sync():  # the same forward+backward without communication; its gradients are thrown away
        train_ddp.lm_loss(run.ddp, tokens, targs.vocab).backward()
    compute = clock.lap()
    run.opt.zero_grad(set_to_none=True)
    clock.lap()
    loss = train_ddp.lm_loss(run.ddp, tokens, targs.vocab)
    loss.backward()  # DDP all-reduces the gradient buckets here, overlapped with the backward pass
    fwd_bwd = clock.lap()
    run.opt.step()
    optimizer = clock.lap()
    run.opt.zero_grad(set_to_none=True)
    return fwd_bwd + optimizer, compute, optimizer, loss.detach()


def run(args, gloo_group, rank: int, world: int, log) -> dict:
    targs = ddp_args(args)
    device = torch.device("cpu")
    data = train_ddp.MarkovData(targs.vocab, targs.seq_len, targs.seed)
    tuned, report = train_ddp.make_tuned(targs, device, data, rank)
    log(f"ddp: tuner chose {tuned.setup['choice']} buckets, hook {tuned.setup['hook']} "
        f"({tuned.setup['tune_s']:.1f} s)")
    runs = [train_ddp.make_baseline(targs, device, gloo_group), tuned]
    samples = {r.name: Samples() for r in runs}
    losses = {r.name: [] for r in runs}
    for step in range(targs.steps):
        tokens = data.batch(targs.batch_size, step, rank, targs.seed)
        for r in runs if step % 2 == 0 else reversed(runs):  # alternate which run goes first
            total, compute, optimizer, loss = timed_step(r, tokens, targs)
            if step >= targs.warmup_steps:
                samples[r.name].add(total, compute, optimizer)
            dist.all_reduce(loss, group=gloo_group)  # the mean loss over ranks, for the check and the log
            losses[r.name].append(loss.item() / world)
    out = {"model": {"kind": "TinyLM (examples/train_ddp.py)", "vocab": targs.vocab, "d_model": targs.d_model,
                     "layers": targs.layers, "heads": targs.heads, "seq_len": targs.seq_len,
                     "batch_per_rank": targs.batch_size,
                     "params": sum(p.numel() for p in runs[0].ddp.parameters())},
           "steps": targs.steps, "warmup_steps": targs.warmup_steps, "runs": []}
    for r in runs:
        crit = samples[r.name].critical(gloo_group)
        mean_step_s = sum(crit["total_ms"]) / len(crit["total_ms"]) / 1e3
        name = r.name if r is runs[0] else f"tuned + {r.setup['choice']} buckets + {r.setup['hook']} hook"
        out["runs"].append({"name": name, "role": "baseline" if r is runs[0] else "tunedist", **r.setup,
                            "samples_per_s": world * targs.batch_size / mean_step_s,
                            "breakdown_ms": breakdown(crit), "samples_ms": crit, "losses": losses[r.name]})
    base, ours = losses[runs[0].name], losses[runs[1].name]
    lossless = tuned.setup["hook"] in LOSSLESS_HOOKS
    diff = max(abs(a - b) for a, b in zip(base, ours))
    # A compressing hook (fp16, bf16, PowerSGD) changes the gradients by design: then the losses are compared to
    # within 1% instead of exactly.
    matched = diff == 0.0 if lossless else diff <= 0.01 * max(abs(x) for x in base)
    out["check"] = {"what": "training loss at every step (mean over ranks)", "exact": lossless,
                    "matched": everywhere(bool(matched), gloo_group),
                    "max_abs_diff": diff, "steps_compared": len(base)}
    out["tune"] = report.as_dict()
    return out
