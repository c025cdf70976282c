"""One large all_reduce on 2 or more ranks of one host: tuned groups under different settings and the all_reduce
stand-in of `python -m tunedist.bench` (the design that the bound's formula describes, run on the job's own CPUs),
taking turns round by round, the order reversed every other round. Per round: the median call in µs, and the memcpy
probe before it. The last column is the stand-in's time over the setting's (> 1: faster than the design runs here).

    SETTINGS=auto,TUNEDIST_SLOT_STORES=cached,TUNEDIST_SLOT_STORES=streaming,TUNEDIST_SLOT_BYTES=4194304 \\
        torchrun --standalone --nproc_per_node=2 benchmarks/allreduce_store_modes.py

SETTINGS: comma-separated, "auto" (the environment as is) or VAR=VALUE; NB: bytes (64 MiB); ROUNDS (6); ITERS (6).
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist
from _common import per_call_us

import tunedist

try:
    from tunedist.bench.standin import AllreduceStandin
except ImportError:  # the benchmark's modules before they became a package
    from tunedist.bench_standin import AllreduceStandin


def main() -> None:
    dist.init_process_group("gloo")
    nbytes = int(os.environ.get("NB", 64 << 20))
    rounds, iters = int(os.environ.get("ROUNDS", 6)), int(os.environ.get("ITERS", 6))
    groups = []
    default = "auto,TUNEDIST_SLOT_STORES=cached,TUNEDIST_SLOT_STORES=streaming"
    for setting in os.environ.get("SETTINGS", default).split(","):
        name, _, value = setting.partition("=")
        if value:
            os.environ[name] = value
        groups.append((setting.replace("TUNEDIST_", ""), dist.new_group(backend="tuned")))
        if value:
            del os.environ[name]
    x = torch.zeros(nbytes // 4)
    standin = AllreduceStandin(nbytes // 4, torch.float32)
    if standin.check() != 0:
        raise RuntimeError("the all_reduce stand-in gave wrong results")
    for _, g in groups:
        for _ in range(3):
            dist.all_reduce(x, group=g)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    times: dict[str, list[float]] = {name: [] for name, _ in groups}
    times["standin"] = []
    memcpy = []
    for rnd in range(rounds):
        times["standin"].append(standin.time_us(3)["best"])
        dist.barrier()
        memcpy.append(sorted(tunedist._C.copy_gbps(dst, src) for _ in range(3))[1])
        for name, g in groups if rnd % 2 == 0 else groups[::-1]:
            dist.barrier(group=g)
            times[name].append(per_call_us(lambda g=g: dist.all_reduce(x, group=g), iters))
    if dist.get_rank() == 0:
        print("memcpy " + " ".join(f"{m:.1f}" for m in memcpy))
        for name, v in times.items():
            ratio = statistics.median([s / t for s, t in zip(times["standin"], v)])
            print(f"{name:32s} " + " ".join(f"{t:7.0f}" for t in v)
                  + f"   median {statistics.median(v):7.0f}  standin/it {ratio:.2f}")
    standin.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
