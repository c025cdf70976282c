"""The group-wide surfaces torch reaches on a backend: on-completion hooks (pg._register_on_completion_hook), ephemeral
timeouts (_add_ephemeral_timeout_for_all_pgs, against a deliberately late rank), the error state (get_error after a
dead peer and after mismatched calls), and the torch.ops.tunedist operators taking a ProcessGroup (the plain Python
object, and its TorchScript object, ProcessGroup.boxed(), as c10d's own operators take it)."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_utils import RankFailure, expect_error, free_port, init_url, launch

# ProcessGroup._add_ephemeral_timeout reaches a plugin backend from torch 2.14 on (Backend::addEphemeralTimeout).
needs_ephemeral_timeout = pytest.mark.skipif(not hasattr(dist.ProcessGroup, "_add_ephemeral_timeout"),
                                             reason="this torch's ProcessGroup has no _add_ephemeral_timeout")

OpType = torch._C._distributed_c10d.OpType
ErrorType = torch._C._distributed_c10d.ErrorType


def _completion_hooks(rank: int, world: int) -> dict:
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    infos, lock = [], threading.Lock()

    def hook(info) -> None:
        with lock:
            infos.append((info.op_type, info.seq, info.time_started, info.time_finished, info.active_duration,
                          threading.get_ident()))

    seq0 = backend._get_sequence_number_for_group()
    t = torch.ones(1024)
    dist.all_reduce(t)  # before the hook: not reported
    pg._register_on_completion_hook(hook)
    second, _ = expect_error(pg._register_on_completion_hook, hook, expected=RuntimeError)
    dist.all_reduce(t)  # synchronous, inline: no Work, still reported
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, src=0)
    out = torch.empty(world * 1024) if rank == 0 else None
    if hasattr(dist, "gather_single"):
        dist.gather_single(t, out, dst=0)
    else:
        dist.all_gather_into_tensor(torch.empty(world * 1024), t)
    dist.barrier()
    # Point-to-point operations are reported too, as ProcessGroupNCCL's watchdog reports them, with their own
    # sequence numbers: a blocking send/recv pair, then an isend/irecv pair.
    peer = 1 - rank if world == 2 else None
    if peer is not None:
        p = torch.full((256,), float(rank))
        if rank == 0:
            dist.send(p, peer)
            dist.recv(p, peer)
        else:
            dist.recv(p, peer)
            dist.send(p, peer)
        (dist.isend(p, peer) if rank == 0 else dist.irecv(p, peer)).wait()
    has_hooks = pg._has_hooks()
    pg._wait_for_pending_works()  # returns once the hook has run for every operation reported so far
    with lock:
        drained = len(infos)
    expected = 8 if peer is not None else 5
    while True:  # the hook runs on the group's hook thread; the launcher's guard ends a hang
        with lock:
            if len(infos) >= expected:
                break
        time.sleep(0.005)
    return {"infos": list(infos), "seq0": seq0, "second": second, "main": threading.get_ident(),
            "supports": backend.supports_completion_hooks if hasattr(backend, "supports_completion_hooks") else None,
            "sum": t[0].item(), "has_hooks": has_hooks, "drained": drained}


def test_on_completion_hook_gets_each_operation():
    for rank, r in enumerate(launch(2, _completion_hooks)):
        infos = r["infos"]
        assert len(infos) == 8, f"rank {rank}: {infos}"
        gather_type = OpType.GATHER if hasattr(dist, "gather_single") else OpType._ALLGATHER_BASE
        want = [OpType.ALLREDUCE, OpType.ALLREDUCE, OpType.BROADCAST, gather_type, OpType.BARRIER]
        collectives = [i for i in infos if i[0] not in (OpType.SEND, OpType.RECV)]
        assert [i[0] for i in collectives] == want, f"rank {rank}: {[i[0] for i in infos]}"
        # numbered as the group numbers them, from the first call after the registration
        assert [i[1] for i in collectives] == [r["seq0"] + k for k in range(2, 7)], f"rank {rank}: {infos}"
        # send and recv in the order each finished on this rank, numbered 1, 2, 3 by the point-to-point counter
        p2p = [(i[0], i[1]) for i in infos if i[0] in (OpType.SEND, OpType.RECV)]
        mine = [OpType.SEND, OpType.RECV, OpType.SEND] if rank == 0 else [OpType.RECV, OpType.SEND, OpType.RECV]
        assert p2p == list(zip(mine, [1, 2, 3])), f"rank {rank}: {p2p}"
        # the group has a hook (destroy_process_group then waits for it), and waiting for pending works returned
        # only once the hook had run for all eight
        assert r["has_hooks"] is True and r["drained"] == 8, r
        for op, seq, started, finished, active, thread in infos:
            assert finished >= started, (op, seq, started, finished)
            assert timedelta(0) <= active <= finished - started + timedelta(microseconds=2), (op, active)
            assert thread != r["main"], "the hook ran on the caller's thread"
        assert "already has an on-completion hook" in r["second"], r["second"]


def _late_rank(rank: int, world: int, port: int, extend: bool) -> str:
    dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world,
                            timeout=timedelta(seconds=3))
    t = torch.ones(16)
    dist.all_reduce(t)  # everyone is there
    if rank == 0 and extend:
        dist.distributed_c10d._add_ephemeral_timeout_for_all_pgs(timedelta(seconds=60))
    if rank == 1:
        time.sleep(8)  # late by more than the group's 3 s
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        return f"failed: {e}"
    dist.all_reduce(t)  # the extension has expired with the first call after it; the group still works
    return f"sum {t[0].item()}"


@needs_ephemeral_timeout
def test_ephemeral_timeout_carries_a_late_rank():
    results = launch(2, _late_rank, free_port(), True, init=False)
    assert results == ["sum 8.0", "sum 8.0"], results


def test_without_the_extension_the_late_rank_times_out():
    results = launch(2, _late_rank, free_port(), False, init=False, return_exceptions=True)
    first = results[0]
    assert not isinstance(first, RankFailure) and first.startswith("failed:"), first
    assert "timed out" in first or "timeout" in first.lower(), first


def _mismatch_then_check(rank: int, world: int, port: int) -> dict:
    dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = backend.get_error()
    dist.all_reduce(torch.ones(8))
    message, _ = expect_error(dist.all_reduce, torch.ones(64 if rank == 0 else 128))
    return {"before": str(before), "after": str(backend.get_error()), "message": message}


def test_error_state_after_mismatched_calls():
    for rank, r in enumerate(launch(2, _mismatch_then_check, free_port(), init=False)):
        assert r["before"] == str(ErrorType.SUCCESS), r
        assert r["after"] == str(ErrorType.COMM_ERROR), f"rank {rank}: {r}"


def _dead_peer(rank: int, world: int, port: int) -> dict:
    dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        os._exit(0)  # dies without a word
    message, _ = expect_error(dist.all_reduce, torch.ones(8))
    return {"after": str(backend.get_error()), "message": message}


def test_error_state_after_a_dead_peer():
    results = launch(2, _dead_peer, free_port(), init=False, return_exceptions=True)
    r = results[0]
    assert not isinstance(r, RankFailure), r
    assert r["after"] == str(ErrorType.REMOTE_ERROR), r


def _ops_with_group_objects(rank: int, world: int) -> dict:
    # The `.group` overloads take the group as c10d's own operators do: the TorchScript object (ProcessGroup.boxed()).
    sub = dist.new_group(list(range(world)))
    got = {}
    # The plain ProcessGroup object (the `.pg` overloads): each operator, through the packet and by name.
    p = torch.full((7,), float(rank + 1))
    torch.ops.tunedist.all_reduce_(p, "sum", sub)
    torch.ops.tunedist.all_reduce_.pg(p, "sum", dist.group.WORLD)
    got["pg_all_reduce"] = p.unique().tolist()
    pg_out = torch.empty(world * 2)
    torch.ops.tunedist.all_gather_into_tensor_(pg_out, torch.full((2,), float(rank)), sub)
    got["pg_all_gather"] = pg_out.tolist()
    pg_rs = torch.empty(2)
    torch.ops.tunedist.reduce_scatter_tensor_(pg_rs, torch.ones(world * 2), "max", dist.group.WORLD)
    got["pg_reduce_scatter"] = pg_rs.tolist()
    pg_b = torch.full((3,), float(rank))
    torch.ops.tunedist.broadcast_(pg_b, 1, sub)
    got["pg_broadcast"] = pg_b.tolist()
    got["pg_not_a_group"], _ = expect_error(torch.ops.tunedist.all_reduce_, p, "sum", 17, expected=ValueError)
    t = torch.full((1001,), float(rank + 1))
    torch.ops.tunedist.all_reduce_(t, "sum", sub.boxed())
    got["all_reduce"] = t.unique().tolist()
    u = torch.full((3,), float(rank + 1))
    torch.ops.tunedist.all_reduce_(u, "max", sub.group_name)  # the name still works
    got["by_name"] = u.unique().tolist()
    out = torch.empty(world * 3)
    torch.ops.tunedist.all_gather_into_tensor_(out, torch.full((3,), float(rank)), dist.group.WORLD.boxed())
    got["all_gather"] = out.tolist()
    rs = torch.empty(3)
    torch.ops.tunedist.reduce_scatter_tensor_(rs, torch.arange(world * 3, dtype=torch.float32), "sum", sub.boxed())
    got["reduce_scatter"] = rs.tolist()
    b = torch.full((4,), float(rank))
    torch.ops.tunedist.broadcast_(b, world - 1, sub.boxed())
    got["broadcast"] = b.tolist()
    return got


def test_direct_operators_take_a_process_group():
    w = 3
    for rank, r in enumerate(launch(w, _ops_with_group_objects)):
        assert r["all_reduce"] == [w * (w + 1) / 2], r
        assert r["by_name"] == [float(w)], r
        assert r["all_gather"] == [float(p) for p in range(w) for _ in range(3)], r
        assert r["reduce_scatter"] == [float(w * (3 * rank + k)) for k in range(3)], r
        assert r["broadcast"] == [float(w - 1)] * 4, r
        assert r["pg_all_reduce"] == [float(w * w * (w + 1) / 2)], r
        assert r["pg_all_gather"] == [float(p) for p in range(w) for _ in range(2)], r
        assert r["pg_reduce_scatter"] == [1.0, 1.0], r
        assert r["pg_broadcast"] == [1.0] * 3, r
        assert "is not a live process group" in r["pg_not_a_group"], r
