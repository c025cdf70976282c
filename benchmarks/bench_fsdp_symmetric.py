"""FSDP2 training step on CPU over `tuned`, with and without symmetric staging buffers, side by side in one job.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_fsdp_symmetric.py --json /tmp/fsdp_sym.json

Two configurations of the same model, data and seeds, on the default `tuned` group:
- plain:     FSDP2 as it comes: its all-gather and reduce-scatter staging buffers are torch.empty, and tuned copies
             them through its shared-memory slots.
- symmetric: every FSDPModule has set_allocate_memory_from_process_group_for_comm(True), so FSDP2 allocates those
             buffers with the backend's allocate_tensor (tuned's symmetric heap) and tuned runs them zero-copy
             where the group measured that faster (per op and size class).
The model is --layers blocks of Linear(--dim, --dim) + ReLU, fp32, each Linear under its own fully_shard (and the
root too), so every all-gather and reduce-scatter moves a whole layer (4 MiB + bias at dim 1024); the batch is small
(--batch rows), so communication dominates the step. Both models are one build (seed --seed) deep-copied before
sharding, so they start identical; step s of either configuration trains on the same batch (a generator seeded by
seed, s and rank), with SGD.

Measured:
- time: --warmup steps per configuration, then --rounds rounds; each round runs both configurations, --steps steps
  each, back to back, their order alternating (plain first in even rounds, symmetric first in odd ones), so load
  drift hits both alike. A configuration's round time is the mean step time of its loop, the slowest rank's (the
  step is synchronous), after a barrier. Reported: median and p10/p90 over rounds, and symmetric/plain per round
  (the two loops of a round ran back to back): median [min-max].
- zero_copy_ops: the growth of tunedist.symmetric_heap_stats()["zero_copy_ops"] over each configuration's steps (the
  least over ranks), per step; plain must add none, symmetric one per all-gather and reduce-scatter whose size class
  the group keeps on a zero-copy path. copy_restarts likewise (ranks that disagreed on symmetry and restarted on the
  copying path).
- losses: each rank's loss at every step of both configurations; they must be equal (same math, world size 2: the
  sum of two values is exact in either order). max_abs_diff is the largest difference over steps and ranks.
- memory: a process's peak RSS only grows, so each configuration's memory is measured in processes of its own: every
  rank starts a child (a fresh 2-rank `tuned` group on a new port) that builds the same model, runs --warmup plus
  --mem-steps steps of one configuration and reports:
  peak RSS: VmHWM of /proc/self/status, the high-water mark of its resident pages, shared memory it touched
    included (a peer's heap chunks it reads count too). Not getrusage's ru_maxrss: a child started by fork/vfork +
    exec inherits its parent's (it read 903 MiB, the parent's RSS, in both children).
  RSS before the first step, and the parts of its RSS at the end: RssAnon (private, mostly torch's CPU allocator)
    and RssShmem (shared memory mapped and touched: tuned's slot segment and heap chunks, its own and its peers').
  heap: symmetric_heap_stats' reserved_bytes and peak_in_use_bytes (what FSDP held in the heap at once). Reserved
    bytes are memory taken whether touched or not (each chunk is posix_fallocate'd in /dev/shm), and they show in
    no RSS until touched: add them to the RSS figures for the symmetric configuration's cost.
  slots: the group's slot memory (tunedist._C.reserved_shm_bytes).
  The table has the most over ranks; the JSON has every rank's (memory.<config>.per_rank, with the children's
  losses, which must be equal across the configurations too).
- load: os.getloadavg() on rank 0 at the start, after the timed rounds and at the end.
Nothing here asserts a time. Timings on a loaded machine are noisy: read the ratios with the load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _common import load_avg, loop_mean_s, over_ranks, percentile, process_group, run_meta, spread, write_json
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

import tunedist

CONFIGS = ("plain", "symmetric")
HEAP_COUNTERS = ("zero_copy_ops", "copy_restarts")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4, help="rows per rank and step (default 4)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per configuration first (default 3)")
    p.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    p.add_argument("--steps", type=int, default=3, help="steps per configuration and round (default 3)")
    p.add_argument("--mem-steps", type=int, default=6, help="steps of each memory child after its warm-up")
    p.add_argument("--no-memory", action="store_true", help="skip the memory children")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)  # a memory child: this configuration
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build_model(args) -> nn.Sequential:
    torch.manual_seed(args.seed)
    return nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.dim, args.dim), nn.ReLU())])


def shard(model: nn.Module, mesh, symmetric: bool) -> nn.Module:
    """fully_shard on every Linear and on the root; symmetric: FSDP2's staging buffers from the group's allocator."""
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():  # the setting is per FSDP module (its own parameter group), not inherited
        if isinstance(m, FSDPModule):
            m.set_allocate_memory_from_process_group_for_comm(symmetric)
    return model


def batch(args, step: int, rank: int):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 101 + rank)
    return torch.randn(args.batch, args.dim, generator=g), torch.randn(args.batch, args.dim, generator=g)


class Run:
    """One configuration: its sharded model and optimizer, the next step's index, and what it measured."""

    def __init__(self, name: str, model: nn.Module, mesh):
        self.name = name
        self.model = shard(model, mesh, name == "symmetric")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        self.next_step, self.losses, self.round_s = 0, [], []
        self.counters = dict.fromkeys(HEAP_COUNTERS, 0)

    def step(self, args, rank: int) -> None:
        x, y = batch(args, self.next_step, rank)
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.item())
        self.next_step += 1

    def steps(self, args, rank: int, n: int) -> float:
        """n steps after a barrier; returns their mean time on this rank and adds the heap counters' growth."""
        before = tunedist.symmetric_heap_stats()
        dist.barrier()
        elapsed = loop_mean_s(lambda: self.step(args, rank), n)
        after = tunedist.symmetric_heap_stats()
        for k in HEAP_COUNTERS:
            self.counters[k] += after[k] - before[k]
        return elapsed


def timed(args, runs: dict, rank: int) -> None:
    """Warm-up, then the interleaved rounds: round r runs plain then symmetric (r even) or the reverse (r odd)."""
    for run in runs.values():
        run.steps(args, rank, args.warmup)
    for k in HEAP_COUNTERS:  # count the timed steps only
        for run in runs.values():
            run.counters[k] = 0
    for r in range(args.rounds):
        for name in CONFIGS if r % 2 == 0 else reversed(CONFIGS):
            (t,) = over_ranks([runs[name].steps(args, rank, args.steps)], dist.ReduceOp.MAX)  # the slowest rank's
            runs[name].round_s.append(t)


def time_summary(args, runs: dict) -> dict:
    out = {}
    for name, run in runs.items():
        zero_copy, restarts = (int(v) for v in over_ranks([run.counters[k] for k in HEAP_COUNTERS],
                                                          dist.ReduceOp.MIN))
        ms = [t * 1e3 for t in run.round_s]
        out[name] = {"step_ms_median": statistics.median(ms), "step_ms_p10": percentile(ms, 0.1),
                     "step_ms_p90": percentile(ms, 0.9), "round_step_ms": ms,
                     "timed_steps": args.rounds * args.steps, "zero_copy_ops": zero_copy,
                     "zero_copy_ops_per_step": zero_copy / (args.rounds * args.steps), "copy_restarts": restarts}
    per_round = [s / p for s, p in zip(runs["symmetric"].round_s, runs["plain"].round_s)]
    out["ratio_symmetric_over_plain"] = {"per_round": per_round, **spread(per_round)}
    return out


def loss_summary(runs: dict) -> dict:
    a, b = runs["plain"].losses, runs["symmetric"].losses
    diff = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    (diff,) = over_ranks([diff], dist.ReduceOp.MAX)
    (unequal,) = over_ranks([float(sum(x != y for x, y in zip(a, b)))], dist.ReduceOp.SUM)
    return {"steps_compared": len(a), "equal": unequal == 0 and len(a) == len(b), "steps_unequal_all_ranks":
            int(unequal), "max_abs_diff": diff, "rank0_losses": {"plain": a, "symmetric": b}}


def status_kib(*keys) -> dict:
    """Fields of /proc/self/status in bytes (VmRSS, RssAnon, RssShmem, ...)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in keys:
                out[name] = int(value.split()[0]) * 1024
    return out


def child(args) -> None:
    """A memory child: one configuration in a fresh group; writes its memory facts to --child-out."""
    with process_group("tuned", args.threads) as (rank, world):
        mesh = init_device_mesh("cpu", (world,))
        run = Run(args.child, build_model(args), mesh)
        before = status_kib("VmRSS")["VmRSS"]
        run.steps(args, rank, args.warmup + args.mem_steps)
        heap = tunedist.symmetric_heap_stats()
        slots = tunedist._C.reserved_shm_bytes(dist.group.WORLD._get_backend(torch.device("cpu")))
        peak = status_kib("VmHWM")["VmHWM"]
        facts = {"peak_rss": peak, "rss_before_steps": before, "peak_growth": peak - before,
                 **{f"end_{k}": v for k, v in status_kib("VmRSS", "RssAnon", "RssShmem", "RssFile").items()},
                 "heap_reserved": heap["reserved_bytes"], "heap_peak_in_use": heap["peak_in_use_bytes"],
                 "zero_copy_ops": heap["zero_copy_ops"], "copy_restarts": heap["copy_restarts"],
                 "slot_shm_bytes": slots, "losses": run.losses}
    write_json(args.child_out, facts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory(args, rank: int, world: int) -> dict:
    """Each configuration in children of their own (see the docstring); the most over ranks of each figure."""
    out = {}
    for name in CONFIGS:
        port = [free_port() if rank == 0 else 0]
        dist.broadcast_object_list(port, src=0)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}  # not torchrun's store
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port[0]), RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "facts.json")
            argv = [sys.executable, os.path.abspath(__file__), *args.argv, "--child", name, "--child-out", path]
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {name} on rank {rank} failed ({proc.returncode}):\n"
                                   f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            with open(path) as f:
                facts = json.load(f)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, facts)
        keys = sorted(k for k in facts if k != "losses")
        out[name] = {**{k: max(f[k] for f in per_rank) for k in keys}, "per_rank": per_rank}
    return out


def mib(n) -> str:
    return f"{n / 2**20:.1f}"


def print_report(args, meta: dict, times: dict, losses: dict, mem: dict | None) -> None:
    print(f"# FSDP2 on tuned, world size {meta['world_size']}: {args.layers} x Linear({args.dim}, {args.dim}) fp32, "
          f"batch {args.batch}/rank, threads {args.threads}; {args.rounds} interleaved rounds x {args.steps} steps "
          f"per configuration after {args.warmup} warm-up steps; load {meta['load_start']} -> "
          f"{meta['load_after_timing']} -> {meta['load_end']} (1/5/15 min, {os.cpu_count()} cpus)")
    print(f"# {'config':<10} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'zero-copy/step':>15} {'restarts':>9} "
          f"{'peak RSS':>9} {'before':>7} {'growth':>7} {'end anon':>9} {'end shmem':>10} {'heap rsv':>9} "
          f"{'heap peak':>10} {'slots':>6}")
    for name in CONFIGS:
        t = times[name]
        m = mem[name] if mem else {}
        cols = [mib(m[k]) if m else "-" for k in ("peak_rss", "rss_before_steps", "peak_growth", "end_RssAnon",
                                                  "end_RssShmem", "heap_reserved", "heap_peak_in_use",
                                                  "slot_shm_bytes")]
        print(f"  {name:<10} {t['step_ms_median']:>10.2f} {t['step_ms_p10']:>8.2f} {t['step_ms_p90']:>8.2f} "
              f"{t['zero_copy_ops_per_step']:>15.1f} {t['copy_restarts']:>9} {cols[0]:>9} {cols[1]:>7} {cols[2]:>7} "
              f"{cols[3]:>9} {cols[4]:>10} {cols[5]:>9} {cols[6]:>10} {cols[7]:>6}")
    r = times["ratio_symmetric_over_plain"]
    print(f"# symmetric / plain step time: median {r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}] over "
          f"{len(r['per_round'])} rounds (per round, the two loops back to back)")
    print(f"# losses: {'EQUAL' if losses['equal'] else 'NOT EQUAL'} over {losses['steps_compared']} steps per rank, "
          f"max abs diff {losses['max_abs_diff']:.3g}"
          + ("" if mem is None else f"; memory children's losses equal: {meta['memory_losses_equal']}"))
    if times["symmetric"]["zero_copy_ops"] == 0 or times["plain"]["zero_copy_ops"] != 0:
        print(f"# WARNING: zero_copy_ops grew by {times['symmetric']['zero_copy_ops']} over the symmetric steps and "
              f"{times['plain']['zero_copy_ops']} over the plain ones: symmetric did not run zero-copy as it should")
    print("# memory (MiB, most over ranks): each configuration in a child process pair of its own; peak RSS = VmHWM, "
          "before = RSS before the first step, growth = peak - before (the same rank's), end anon/shmem = RssAnon/"
          "RssShmem after the steps (shmem: slots and heap chunks touched, a peer's included), heap rsv/peak = "
          "symmetric_heap_stats reserved/peak_in_use, slots = the group's slot segment")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the memory children are started with
    if args.child:
        child(args)
        return 0
    with process_group("tuned", args.threads) as (rank, world):
        run(args, rank, world)
    return 0


def run(args, rank: int, world: int) -> None:
    """Both configurations timed in turns, then (unless --no-memory) each in its memory children; rank 0 reports."""
    mesh = init_device_mesh("cpu", (world,))
    meta = {**run_meta(), "args": vars(args), "load_start": load_avg()}
    base = build_model(args)
    runs = {name: Run(name, copy.deepcopy(base), mesh) for name in CONFIGS}
    del base
    timed(args, runs, rank)
    meta["load_after_timing"] = load_avg()
    meta["heap_after_timing_rank0"] = tunedist.symmetric_heap_stats()  # the timed group's heap (symmetric's only)
    times, losses = time_summary(args, runs), loss_summary(runs)
    mem = None if args.no_memory else memory(args, rank, world)
    if mem:  # every rank's losses, in both children
        meta["memory_losses_equal"] = all(p["losses"] == s["losses"] for p, s in zip(mem["plain"]["per_rank"],
                                                                                     mem["symmetric"]["per_rank"]))
    meta["load_end"] = load_avg()
    if rank == 0:
        print_report(args, meta, times, losses, mem)
        if args.json:
            write_json(args.json, {**meta, "time": times, "losses": losses, "memory": mem})


if __name__ == "__main__":
    sys.exit(main())
