"""Checks of every collective against closed-form values, for groups whose ranks sit on several hosts.

Shared by tests/python/test_multihost.py (ranks started by ``dist_utils.launch`` with a TUNEDIST_HOST_ID each) and
tests/python/multihost_worker.py (ranks started by two torchruns). Every function runs inside a rank, raises
AssertionError naming the op, dtype, size and rank on a wrong value, and returns a small summary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import tunedist

# Sizes: empty, one element, odd (a tail on every host slicing), past the one-shot limit (two-shot on shm).
SIZES = [0, 1, 7, 1001, 70_001]


def _values(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Small positional integers (exact in every dtype, bf16 included): i % 7 + 1."""
    return (torch.arange(n) % 7 + 1).to(dtype)


def _expect(name: str, got: torch.Tensor, want: torch.Tensor, rank: int) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        bad = (got != want).nonzero()
        where = f"first wrong index {bad[0].tolist()}" if got.shape == want.shape and bad.numel() else ""
        raise AssertionError(f"{name} on rank {rank}: got {got.dtype}{tuple(got.shape)} "
                             f"{got.reshape(-1)[:6].tolist()}, expected {want.dtype}{tuple(want.shape)} "
                             f"{want.reshape(-1)[:6].tolist()} {where}")


def check_all_reduce(rank: int, world: int, group=None) -> None:
    tri = world * (world + 1) // 2
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.float64):
        for n in SIZES:
            base = _values(n, dtype)
            t = base * (rank + 1)
            dist.all_reduce(t, group=group)
            _expect(f"all_reduce SUM {dtype} n={n}", t, base * tri, rank)
    for n in (7, 70_001):
        base = _values(n, torch.float32)
        t = base * (rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
        _expect(f"all_reduce AVG n={n}", t, base * tri / world, rank)
        t = base + rank
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        _expect(f"all_reduce MAX n={n}", t, base + world - 1, rank)
        t = base + rank
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        _expect(f"all_reduce MIN n={n}", t, base, rank)
        t = torch.full((n,), rank + 1, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=group)
        _expect(f"all_reduce PRODUCT n={n}", t, torch.full((n,), _factorial(world), dtype=torch.int32), rank)
        t = torch.arange(n) % 2 == (rank % 2)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        _expect(f"all_reduce bool n={n}", t, torch.ones(n, dtype=torch.bool) if world > 1 else t, rank)
        t = base * (rank + 1)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=group)
        _expect(f"all_reduce PREMUL_SUM n={n}", t, base * tri * 0.5, rank)
    ts = [_values(5, torch.float32) * (rank + 1), _values(3, torch.float32) * (rank + 1)]
    group_pg = group if group is not None else dist.group.WORLD
    group_pg.allreduce_coalesced(ts).wait()
    _expect("all_reduce_coalesced", ts[1], _values(3, torch.float32) * tri, rank)


def _factorial(k: int) -> int:
    out = 1
    for i in range(2, k + 1):
        out *= i
    return out


def check_rooted(rank: int, world: int, group=None) -> None:
    for root in range(world):
        groot = dist.get_global_rank(group, root) if group is not None else root
        for n in (0, 7, 70_001):
            t = _values(n, torch.float32) * (rank + 1)
            dist.broadcast(t, src=groot, group=group)
            _expect(f"broadcast root={root} n={n}", t, _values(n, torch.float32) * (root + 1), rank)
            t = _values(n, torch.float32) * (rank + 1)
            dist.reduce(t, dst=groot, group=group)
            if rank == root:
                _expect(f"reduce root={root} n={n}", t, _values(n, torch.float32) * (world * (world + 1) // 2), rank)
        x = torch.full((3,), float(rank))
        outs = [torch.empty(3) for _ in range(world)] if rank == root else None
        dist.gather(x, outs, dst=groot, group=group)
        if rank == root:
            for p in range(world):
                _expect(f"gather root={root} from {p}", outs[p], torch.full((3,), float(p)), rank)
        ins = [torch.full((4,), float(10 * p + root)) for p in range(world)] if rank == root else None
        y = torch.empty(4)
        dist.scatter(y, ins, src=groot, group=group)
        _expect(f"scatter root={root}", y, torch.full((4,), float(10 * rank + root)), rank)


def check_gathers(rank: int, world: int, group=None) -> None:
    for n in (0, 1, 1001):
        x = _values(n, torch.int64) + rank
        outs = [torch.empty(n, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(outs, x, group=group)
        for p in range(world):
            _expect(f"all_gather n={n} block {p}", outs[p], _values(n, torch.int64) + p, rank)
        out = torch.empty(world * n, dtype=torch.int64)
        dist.all_gather_into_tensor(out, x, group=group)
        _expect(f"all_gather_into_tensor n={n}", out, torch.cat([_values(n, torch.int64) + p for p in range(world)]),
                rank)
    tri = world * (world + 1) // 2
    for n in (1, 1001):
        inp = torch.cat([_values(n, torch.float32) * (p + 1) * (rank + 1) for p in range(world)])
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, inp, group=group)
        _expect(f"reduce_scatter_tensor n={n}", out, _values(n, torch.float32) * (rank + 1) * tri, rank)
        blocks = [_values(n, torch.float32) * (p + 1) * (rank + 1) for p in range(world)]
        out = torch.empty(n)
        dist.reduce_scatter(out, blocks, group=group)
        _expect(f"reduce_scatter n={n}", out, _values(n, torch.float32) * (rank + 1) * tri, rank)


def check_all_to_all(rank: int, world: int, group=None) -> None:
    inp = torch.tensor([100 * rank + p for p in range(world)], dtype=torch.int32)
    out = torch.empty(world, dtype=torch.int32)
    dist.all_to_all_single(out, inp, group=group)
    _expect("all_to_all_single", out, torch.tensor([100 * p + rank for p in range(world)], dtype=torch.int32), rank)
    # Uneven: rank r sends p+1 rows to rank p, receives r+1 rows from everyone.
    send = [p + 1 for p in range(world)]
    recv = [rank + 1] * world
    inp = torch.cat([torch.full((p + 1, 2), float(100 * rank + p)) for p in range(world)])
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, inp, recv, send, group=group)
    want = torch.cat([torch.full((rank + 1, 2), float(100 * p + rank)) for p in range(world)])
    _expect("all_to_all_single uneven", out, want, rank)
    ins = [torch.full((p + 2,), float(rank)) for p in range(world)]
    outs = [torch.empty(rank + 2) for _ in range(world)]
    dist.all_to_all(outs, ins, group=group)
    for p in range(world):
        _expect(f"all_to_all from {p}", outs[p], torch.full((rank + 2,), float(p)), rank)


def check_p2p(rank: int, world: int, group=None) -> None:
    if world < 2:
        return
    to_rank = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    # First, before any other message between them: a swap with the mirror rank, each sending and receiving at once.
    # Across hosts that is the pair's first use, so its send and its receive both ask for the pair's gloo group at once.
    mirror = world - 1 - rank
    if mirror != rank:
        send, recv = _values(9, torch.float32) + rank, torch.empty(9)
        # isend and irecv, not batch_isend_irecv: a coalesced block is a collective, which the middle rank of an odd
        # world would not join.
        works = [dist.isend(send, to_rank(mirror), group), dist.irecv(recv, to_rank(mirror), group)]
        for w in works:
            w.wait()
        _expect("send/recv swap with the mirror rank", recv, _values(9, torch.float32) + mirror, rank)
    right, left = (rank + 1) % world, (rank - 1) % world
    for n in (0, 5, 70_001):
        send = _values(n, torch.float32) + rank
        recv = torch.empty(n)
        ops = [dist.P2POp(dist.isend, send, to_rank(right), group), dist.P2POp(dist.irecv, recv, to_rank(left), group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        _expect(f"send/recv ring n={n}", recv, _values(n, torch.float32) + left, rank)


def run_all(rank: int, world: int, group=None) -> dict:
    check_all_reduce(rank, world, group)
    check_rooted(rank, world, group)
    check_gathers(rank, world, group)
    check_all_to_all(rank, world, group)
    check_p2p(rank, world, group)
    dist.barrier(group=group)
    return {"hosts": host_layout(group)}


def tuned_backend(group=None):
    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cpu"))


def host_layout(group=None) -> list:
    return tunedist._C.host_layout(tuned_backend(group))


def gloo_bytes_of_all_reduce(n: int, group=None) -> int:
    """Bytes this rank hands to gloo for one float32 all_reduce of n elements."""
    before = tunedist._C.cross_host_stats(tuned_backend(group))["data_bytes"]
    t = torch.ones(n)
    dist.all_reduce(t, group=group)
    after = tunedist._C.cross_host_stats(tuned_backend(group))["data_bytes"]
    return after - before


def ddp_matches_gloo(rank: int, world: int, steps: int = 5) -> float:
    """Trains one small model with DDP over `tuned` and one over a gloo group from the same start and data;
    returns the largest parameter difference (0.0 when they agree bit for bit)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    models = []
    for pg in (None, gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        ddp = DDP(model, process_group=pg, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1000 + rank)
        for _ in range(steps):
            x = torch.randn(8, 32, generator=gen)
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        models.append(model)
    diff = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters()))
    dist.destroy_process_group(gloo)
    return diff
