"""Bytes that one all_reduce puts on the veth, each way, per backend: checks the accounting of netns_report.py.

netns_bench.sh runs it under the same two torchruns as the benchmark, one per network namespace:

    torchrun --nnodes=2 --nproc-per-node=2 ... benchmarks/netns_wire.py --bytes 16M --iters 4 --json wire.json

Each namespace's only way to the other is its end of the veth pair (GLOO_SOCKET_IFNAME names it), so the
interface's tx_bytes counter, read by the node's local rank 0 around ITERS back-to-back all_reduces of BYTES,
is what that node sent across per op, link-layer headers included (about 1514 bytes per 1448 bytes of TCP
payload at MTU 1500), plus the ACKs of the other way's stream and two barriers' worth of control traffic. The
record also holds what tuned itself handed to gloo per rank (tunedist._C.cross_host_stats), the host layout and
each result's correctness.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from _common import parse_size, process_group, run_meta, write_json

import tunedist


def tx_bytes(dev: str) -> int:
    with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
        return int(f.read())


def measure(backend: str, group, count: int, iters: int, dev: str, reader: bool) -> dict:
    """tx_bytes of this namespace's veth over `iters` all_reduces of `count` float32 on `group` (reader only)."""
    t = torch.ones(count)
    dist.all_reduce(t, group=group)  # connects gloo's pairs and makes tuned's cross-host groups before counting
    tuned = group._get_backend(torch.device("cpu")) if backend == "tuned" else None
    handed0 = tunedist._C.cross_host_stats(tuned)["data_bytes"] if tuned is not None else 0
    before = tx_bytes(dev) if reader else 0
    dist.barrier()  # nobody sends before every reader has read its counter
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    dist.barrier()
    after = tx_bytes(dev) if reader else 0
    handed = tunedist._C.cross_host_stats(tuned)["data_bytes"] - handed0 if tuned is not None else None
    world = dist.get_world_size()
    wrong = int((t != float(world ** (iters + 1))).sum())  # exact in float32 for the sizes used here
    return {"tx_bytes": after - before, "handed_to_gloo": handed, "wrong": wrong}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=parse_size, default=16 << 20, help="per-rank all_reduce size (default 16M)")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--backends", default="tuned,gloo")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    with process_group("gloo") as (rank, world):  # the default group: barriers and the final gather only
        groups = {b: dist.new_group(backend=b) for b in args.backends.split(",") if b}
        dev, local_rank = os.environ["GLOO_SOCKET_IFNAME"], int(os.environ["LOCAL_RANK"])
        count = args.bytes // 4
        mine = {"rank": rank, "node": int(os.environ["GROUP_RANK"]), "local_rank": local_rank, "dev": dev,
                "backends": {b: measure(b, g, count, args.iters, dev, local_rank == 0) for b, g in groups.items()}}
        if "tuned" in groups:
            mine["tuned_hosts"] = tunedist._C.host_layout(groups["tuned"]._get_backend(torch.device("cpu")))
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            write_json(args.json, {**run_meta(), "bytes": count * 4, "iters": args.iters, "ranks": everyone})
        dist.barrier()  # every rank is done with the measured groups
        for g in groups.values():
            dist.destroy_process_group(g)
    return 1 if any(b["wrong"] for r in everyone for b in r["backends"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
