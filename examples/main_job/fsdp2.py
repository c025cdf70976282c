"""The main job's FSDP2 workload: fully_shard on a CPU mesh with mixed precision, over gloo and over `tuned`.

The model is examples/train_ddp.py's transformer (its own, smaller sizes here), each encoder layer and the root under
fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), as FSDP2 jobs commonly run:
bf16 parameters all-gathered for the compute, fp32 gradients reduce-scattered onto fp32 shards, AdamW on the shards.
- baseline: the mesh over a gloo group;
- tunedist: the mesh over a `tuned` group, every FSDP module with set_allocate_memory_from_process_group_for_comm
  (FSDP2's all-gather outputs and reduce-scatter inputs then come from tuned's symmetric heap, and those
  collectives run zero-copy where the group measured that faster, per op and size class).
FSDP2 reduces fp32 gradients with ReduceOp.AVG, which gloo refuses; both runs therefore use
set_force_sum_reduction_for_comms(True) (a SUM, then FSDP divides), so the two do the same arithmetic.
Steps alternate between the runs. A step's compute is an unsharded bf16 replica's forward+backward on the same
batch, timed just before it; the optimizer is AdamW's step.

Memory per rank, each run alike: state (the fp32 parameter shards, their gradients and AdamW's two moments), the
step's peak growth of resident memory (common.PeakRss, the most over the timed steps; glibc's mmap threshold is fixed
so freed tensors leave RSS), and the communication memory held between steps: for tunedist the group's symmetric heap
(reserved, in /dev/shm) and its slot segment; for gloo none is counted (its buffers are small and not exposed).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import train_ddp
from common import PeakRss, Samples, Timer, breakdown, everywhere, tensor_bytes
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import tunedist

CPU = torch.device("cpu")


def build(args) -> torch.nn.Module:
    torch.manual_seed(args.seed)  # the same initial weights in both runs, the replica and on every rank
    return train_ddp.TinyLM(args.fsdp_vocab, args.fsdp_d_model, args.fsdp_layers, 4, args.fsdp_seq_len)


def shard(model: torch.nn.Module, group, symmetric: bool) -> torch.nn.Module:
    mesh = DeviceMesh.from_group(group, "cpu")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():  # both settings are per FSDP module (its own parameter group), not inherited
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_allocate_memory_from_process_group_for_comm(symmetric)
    return model


class Run:
    def __init__(self, name: str, role: str, model, group, symmetric: bool, lr: float):
        self.name, self.role, self.group, self.symmetric = name, role, group, symmetric
        self.model = shard(model, group, symmetric)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.samples, self.losses, self.step_growth = Samples(), [], []

    def state_bytes(self) -> int:
        """This rank's fp32 shards, their gradients and AdamW's moments (after a step has created them)."""
        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's numel() is the global one

        shards = [local(p) for p in self.model.parameters()]
        moments = [local(v) for s in self.opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
        return tensor_bytes(shards) * 2 + tensor_bytes(moments)

    def comm_bytes(self) -> dict:
        if not self.symmetric:
            return {"heap_reserved": 0, "heap_peak_in_use": 0, "slots": 0}
        heap = tunedist.symmetric_heap_stats(self.group)
        return {"heap_reserved": heap["reserved_bytes"], "heap_peak_in_use": heap["peak_in_use_bytes"],
                "slots": tunedist._C.reserved_shm_bytes(self.group._get_backend(CPU))}


def compute_only(replica, tokens, vocab: int) -> float:
    clock = Timer()
    train_ddp.lm_loss(replica, tokens, vocab).backward()
    elapsed = clock.lap()
    replica.zero_grad(set_to_none=True)
    return elapsed


def step(run: Run, tokens, vocab: int, compute: float, timed: bool) -> None:
    peak = PeakRss()
    clock = Timer()
    loss = train_ddp.lm_loss(run.model, tokens, vocab)
    loss.backward()
    fwd_bwd = clock.lap()
    run.opt.step()
    optimizer = clock.lap()
    run.opt.zero_grad(set_to_none=True)
    if timed:
        run.samples.add(fwd_bwd + optimizer, compute, optimizer)
        run.step_growth.append(peak.growth())
    run.losses.append(loss.item())


def run(args, gloo_group, rank: int, world: int, log) -> dict:
    tuned_group = dist.new_group(backend="tuned")
    base = build(args)
    replica = copy.deepcopy(base).to(torch.bfloat16)  # the compute reference: no sharding, no communication
    runs = [Run("gloo + FSDP2", "baseline", copy.deepcopy(base), gloo_group, False, args.lr),
            Run("tuned + FSDP2 + symmetric buffers", "tunedist", copy.deepcopy(base), tuned_group, True, args.lr)]
    del base
    zero_copy_before = tunedist.symmetric_heap_stats(tuned_group)["zero_copy_ops"]
    total_steps = args.fsdp_warmup + args.fsdp_steps
    for s in range(total_steps):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + s * 1009 + rank)
        tokens = torch.randint(0, args.fsdp_vocab, (args.fsdp_batch, args.fsdp_seq_len + 1), generator=g)
        for r in runs if s % 2 == 0 else reversed(runs):
            compute = compute_only(replica, tokens, args.fsdp_vocab)
            step(r, tokens, args.fsdp_vocab, compute, timed=s >= args.fsdp_warmup)
    zero_copy = tunedist.symmetric_heap_stats(tuned_group)["zero_copy_ops"] - zero_copy_before
    log(f"fsdp2: {zero_copy} zero-copy collectives in {total_steps} tunedist steps")
    out = {"model": {"kind": "TinyLM (examples/train_ddp.py)", "vocab": args.fsdp_vocab,
                     "d_model": args.fsdp_d_model, "layers": args.fsdp_layers, "seq_len": args.fsdp_seq_len,
                     "batch_per_rank": args.fsdp_batch, "params": sum(p.numel() for p in replica.parameters()),
                     "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}},
           "steps": args.fsdp_steps, "warmup_steps": args.fsdp_warmup, "zero_copy_ops": zero_copy,
           "peak_rss_measured": runs[0].step_growth[0] is not None, "runs": []}
    for r in runs:
        crit = r.samples.critical(gloo_group)
        comm = r.comm_bytes()
        growth = max(r.step_growth) if r.step_growth[0] is not None else 0
        mem = {"state": r.state_bytes(), "step_peak_growth": growth,
               "comm_held": comm["heap_reserved"] + comm["slots"], **comm}
        mem["peak"] = mem["state"] + mem["step_peak_growth"] + mem["comm_held"]
        t = torch.tensor([float(v) for v in mem.values()], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo_group)  # the most over ranks
        mem = {k: int(v) for k, v in zip(mem, t.tolist())}
        out["runs"].append({"name": r.name, "role": r.role, "backend": "gloo" if r.role == "baseline" else "tuned",
                            "symmetric_buffers": r.symmetric, "breakdown_ms": breakdown(crit),
                            "samples_ms": crit, "memory_bytes": mem, "losses": r.losses})
    base_l, ours_l = runs[0].losses, runs[1].losses
    diff = max(abs(a - b) for a, b in zip(base_l, ours_l))
    out["check"] = {"what": "each rank's training loss at every step", "exact": True,
                    "matched": everywhere(diff == 0.0, gloo_group), "max_abs_diff": diff,
                    "steps_compared": len(base_l)}
    return out
