"""A mix of sizes on one group: N1 all_reduces of 1 MiB, then N32 of 32 MiB, in turn (N1 = N32 = 1: DDP-like, whose
first bucket is 1 MiB and the others 25 MiB; N1=40 N32=4: bursts, as phases of a job that mix small and large calls). Three tuned groups in one job, created with TUNEDIST_SLOT_STORES auto / cached / streaming, take
turns for ROUNDS rounds of PAIRS such turns; printed: median µs per size and group over the rounds after the first half
(the auto group's windows have run by then), and the auto group's last picks per size class.
    torchrun --standalone --nproc_per_node=2 docs/records/issue14/s26/tried_classes/mixed.py"""
import os
import statistics
import time

import torch
import torch.distributed as dist

import tunedist

dist.init_process_group("tuned")
groups = {}
for mode in ("auto", "cached", "streaming"):
    os.environ["TUNEDIST_SLOT_STORES"] = mode
    groups[mode] = dist.new_group(backend="tuned")
os.environ.pop("TUNEDIST_SLOT_STORES")
sizes = {"1M": torch.ones(1 << 18), "32M": torch.ones(8 << 20)}
rounds, pairs = int(os.environ.get("ROUNDS", "12")), int(os.environ.get("PAIRS", "40"))
repeat = {"1M": int(os.environ.get("N1", "1")), "32M": int(os.environ.get("N32", "1"))}
times = {(m, s): [] for m in groups for s in sizes}
for r in range(rounds):
    for mode, g in groups.items():
        dist.barrier(group=g)
        per = {s: [] for s in sizes}
        for _ in range(pairs):
            for s, t in sizes.items():
                for _ in range(repeat[s]):
                    t0 = time.perf_counter()
                    dist.all_reduce(t, group=g)
                    per[s].append(time.perf_counter() - t0)
        for s in sizes:
            times[(mode, s)].append(statistics.median(per[s]) * 1e6)
if dist.get_rank() == 0:
    half = rounds // 2
    cells = " ".join(f"{m}:{s}={statistics.median(v[half:]):.0f}" for (m, s), v in times.items())
    stats = tunedist._C.slot_store_stats(groups["auto"]._get_backend(torch.device("cpu")))
    picks = " ".join(f"{r['op']}>={r['slot_bytes_from'] >> 10}K:{'s' if r['streaming'] else 'c'}"
                     for r in stats["round_chooser"] if r["op"] == "all_reduce_two_shot")
    print("MIXED", os.path.dirname(tunedist.__file__), f"N1={repeat['1M']} N32={repeat['32M']}", cells, picks, "load", f"{os.getloadavg()[0]:.2f}", flush=True)
dist.destroy_process_group()
