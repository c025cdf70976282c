"""tunedist.all_reduce and torch.ops.tunedist.all_reduce_ (csrc/ops/, python/tunedist/ops.py): the synchronous
in-place all_reduce without torch.distributed's Python layer, on real process groups; and its siblings
all_gather_into_tensor, reduce_scatter_tensor and broadcast.

It must give what dist.all_reduce gives on the same group (every dtype and reduce op, non-contiguous tensors, the
one-shot and two-shot paths, subgroups, other backends), share the group's sequence with dist.all_reduce, and fail
as dist.all_reduce fails: a mismatch between ranks and a dead peer on every rank, bad arguments with a clear error.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from dist_utils import RankFailure, expect_error, launch, make_input, mismatch, reference

WORLD = 3
# (dtype, ops): every reduce op the backend has for the dtype (AVG on floating types only; bitwise ops on integers).
CASES = [
    (torch.float32, ("sum", "avg", "product", "min", "max")),
    (torch.bfloat16, ("sum", "avg", "max")),
    (torch.float16, ("sum", "min")),
    (torch.float64, ("sum", "product")),
    (torch.int32, ("sum", "max", "band", "bor", "bxor")),
    (torch.int64, ("sum", "min")),
]
ENUMS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
         "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
         "bxor": dist.ReduceOp.BXOR}


def _input(rank: int, numel: int, dtype, op: str) -> torch.Tensor:
    return make_input(dtype, numel, rank, tag=f"direct-{op}", kind="prod" if op == "product" else "gen")


def _expected(world: int, numel: int, dtype, op: str, ranks=None) -> torch.Tensor:
    ranks = list(range(world)) if ranks is None else ranks
    return reference(op.upper(), [_input(r, numel, dtype, op) for r in ranks])


def _results_match(rank: int, world: int) -> dict:
    import tunedist

    checked = 0
    seq = dist.group.WORLD._get_sequence_number_for_group
    for dtype, ops in CASES:
        for op in ops:
            # 1001 elements: one-shot; 3 MiB of float32: the two-shot path over several slots.
            for numel in (1001, (3 << 20) // 4):
                if numel > 1001 and dtype != torch.float32:
                    continue
                for how in ("enum", "name", "raw"):
                    t = _input(rank, numel, dtype, op)
                    before = seq()
                    if how == "enum":
                        out = tunedist.all_reduce(t, ENUMS[op])
                    elif how == "name":
                        out = tunedist.all_reduce(t, op=op, group=dist.group.WORLD)
                    else:
                        out = torch.ops.tunedist.all_reduce_(t, op, dist.group.WORLD.group_name)
                    assert (out is t) if how != "raw" else (out is None), (how, op, dtype, out)
                    assert seq() == before + 1, (how, op, dtype, before, seq())  # one operation of the group
                    problem = mismatch(t, _expected(world, numel, dtype, op))
                    assert not problem, (how, op, dtype, numel, problem)
                    checked += 1
    # Mixed with dist.all_reduce in any order: one sequence, one engine.
    a, b = _input(rank, 4096, torch.float32, "sum"), _input(rank, 4096, torch.float32, "sum")
    tunedist.all_reduce(a)
    dist.all_reduce(b)
    tunedist.all_reduce(b)
    dist.all_reduce(a)
    assert torch.equal(a, b)
    # A non-contiguous tensor is reduced where it lies (DeepSpeed's op returns it unchanged).
    base = _input(rank, 64 * 48, torch.float32, "sum").reshape(64, 48)
    t = base.t()
    want = _expected(world, 64 * 48, torch.float32, "sum").reshape(64, 48).t()
    tunedist.all_reduce(t)
    assert not t.is_contiguous() and torch.equal(t, want)
    # A subgroup: the group is honoured (DeepSpeed reduces over the world whatever it is given); a rank outside the
    # group gets its tensor back unchanged, as from dist.all_reduce.
    sub = dist.new_group([0, 2], backend="tuned")
    t = _input(rank, 333, torch.float32, "sum")
    mine = t.clone()
    tunedist.all_reduce(t, group=sub)
    if rank == 1:
        assert torch.equal(t, mine)
    else:
        assert torch.equal(t, _expected(world, 333, torch.float32, "sum", ranks=[0, 2]))
    # Another backend: its own allreduce.
    gloo = dist.new_group(backend="gloo")
    t = _input(rank, 500, torch.float32, "max")
    tunedist.all_reduce(t, dist.ReduceOp.MAX, group=gloo)
    assert torch.equal(t, _expected(world, 500, torch.float32, "max"))
    return {"checked": checked}


def test_results_match_dist_all_reduce():
    results = launch(WORLD, _results_match)
    # 19 (dtype, op) pairs x 3 call forms, plus float32's five ops at 3 MiB x 3.
    assert [r["checked"] for r in results] == [72] * WORLD, results


def _siblings(rank: int, world: int) -> int:
    import tunedist

    seq = dist.group.WORLD._get_sequence_number_for_group
    checked = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for numel in (1001, (3 << 20) // 4):  # one slot, and several
            if numel > 1001 and dtype != torch.float32:
                continue
            inputs = [_input(r, numel, dtype, "sum") for r in range(world)]
            # all_gather_into_tensor: every rank's block, in rank order.
            out = torch.empty(world * numel, dtype=dtype)
            before = seq()
            assert tunedist.all_gather_into_tensor(out, inputs[rank]) is out
            assert seq() == before + 1
            assert not mismatch(out, torch.cat(inputs)), (dtype, numel)
            # reduce_scatter_tensor: block `rank` of the reduction of every rank's whole array.
            arrays = [_input(r, world * numel, dtype, "max") for r in range(world)]
            mine = torch.empty(numel, dtype=dtype)
            assert tunedist.reduce_scatter_tensor(mine, arrays[rank], dist.ReduceOp.MAX) is mine
            want = reference("MAX", arrays).narrow(0, rank * numel, numel)
            assert not mismatch(mine, want), (dtype, numel)
            # broadcast from global rank 1, then from group rank 2 as group_src.
            for kw, root in (({"src": 1}, 1), ({"group_src": 2}, 2)):
                t = _input(rank, numel, dtype, f"bcast{root}")
                assert tunedist.broadcast(t, **kw) is t
                assert not mismatch(t, _input(root, numel, dtype, f"bcast{root}")), (dtype, numel, kw)
            checked += 4
    # A subgroup of global ranks 0 and 2: src is a global rank (2), as in dist.broadcast; rank 1 is outside.
    sub = dist.new_group([0, 2], backend="tuned")
    t = _input(rank, 77, torch.float32, "subb")
    tunedist.broadcast(t, src=2, group=sub)
    assert not mismatch(t, _input(2 if rank != 1 else 1, 77, torch.float32, "subb"))
    out = torch.zeros(2 * 77)
    tunedist.all_gather_into_tensor(out, _input(rank, 77, torch.float32, "suba"), group=sub)
    want = torch.zeros(2 * 77) if rank == 1 else torch.cat([_input(r, 77, torch.float32, "suba") for r in (0, 2)])
    assert torch.equal(out, want)
    # Mixed with torch.distributed's calls, and on gloo.
    gloo = dist.new_group(backend="gloo")
    out = torch.empty(world * 5)
    tunedist.all_gather_into_tensor(out, torch.full((5,), float(rank)), group=gloo)
    dist.all_gather_into_tensor(out, torch.full((5,), float(rank)))
    tunedist.reduce_scatter_tensor(mine := torch.empty(5), out, group=gloo)
    assert torch.equal(mine, torch.full((5,), float(world * rank)))
    return checked


def test_siblings_match_torch_distributed():
    assert launch(WORLD, _siblings) == [16] * WORLD


def _mismatch(rank: int, world: int) -> str:
    import tunedist

    tunedist.all_reduce(torch.ones(64))
    if rank == 0:
        return expect_error(tunedist.all_reduce, torch.ones(1024))[0]
    return expect_error(dist.all_reduce, torch.ones(2048))[0]


def test_ranks_that_disagree_all_get_the_error():
    messages = launch(2, _mismatch)
    for rank, msg in enumerate(messages):
        assert f"on rank {rank} of 2" in msg and "ranks disagree" in msg, msg
        assert "rank 0 called all_reduce" in msg and "count 1024" in msg and "count 2048" in msg, msg


def _debug_detail(rank: int, world: int) -> str:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend (ProcessGroupWrapper): the operator takes the
    general path through it, and the wrapper's own check catches ranks that disagree."""
    from torch.distributed.distributed_c10d import DebugLevel, get_debug_level

    import tunedist

    assert get_debug_level() == DebugLevel.DETAIL
    t = _input(rank, 1001, torch.float32, "sum")
    tunedist.all_reduce(t)
    problem = mismatch(t, _expected(world, 1001, torch.float32, "sum"))
    assert not problem, problem
    return expect_error(tunedist.all_reduce, torch.ones(16 if rank == 0 else 32), expected=RuntimeError)[0]


def test_debug_detail_goes_through_torchs_wrapper():
    messages = launch(2, _debug_detail, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for msg in messages:
        assert "mismatch" in msg.lower() or "disagree" in msg, msg


def _dead_peer(rank: int, world: int) -> str:
    import tunedist

    tunedist.all_reduce(torch.ones(256))
    dist.barrier()
    if rank == 1:
        os._exit(0)  # gone without a word, as a crashed rank is
    return expect_error(tunedist.all_reduce, torch.ones(256))[0]


def test_dead_peer_is_an_error_not_a_hang():
    results = launch(2, _dead_peer, return_exceptions=True)
    assert isinstance(results[1], RankFailure), results[1]
    msg = results[0]
    assert isinstance(msg, str), msg
    assert "all_reduce" in msg and "rank 1" in msg and "dead" in msg, msg


def _bad_arguments(rank: int, world: int) -> list:
    import tunedist

    seen = []
    t = torch.ones(8)
    for op in (dist.ReduceOp.PREMUL_SUM, "mean", 3, object()):
        with pytest.raises(ValueError, match="unsupported reduce op"):
            tunedist.all_reduce(t, op)
        seen.append(repr(op))
    with pytest.raises(RuntimeError, match="no process group is registered under the name 'no-such-group'"):
        torch.ops.tunedist.all_reduce_(t, "sum", "no-such-group")
    with pytest.raises(RuntimeError, match="unknown reduce op 'mean'"):
        torch.ops.tunedist.all_reduce_(t, "mean", dist.group.WORLD.group_name)
    # Nothing above reached the group: it still agrees with the peer.
    assert torch.equal(tunedist.all_reduce(t), torch.full((8,), float(world)))
    for kw in ({}, {"src": 0, "group_src": 0}):
        with pytest.raises(ValueError, match="give exactly one of src"):
            tunedist.broadcast(t, **kw)
    with pytest.raises(RuntimeError, match="tunedist.all_gather_into_tensor: no process group is registered"):
        torch.ops.tunedist.all_gather_into_tensor_(torch.empty(16), t, "no-such-group")
    with pytest.raises(RuntimeError, match="tunedist.reduce_scatter_tensor: unknown reduce op 'mean'"):
        torch.ops.tunedist.reduce_scatter_tensor_(torch.empty(4), t, "mean", dist.group.WORLD.group_name)
    with pytest.raises(ValueError, match="tunedist.reduce_scatter_tensor: unsupported reduce op"):
        tunedist.reduce_scatter_tensor(torch.empty(4), torch.empty(4 * world), "mean")
    # dist.ReduceOp objects, as dist.all_reduce takes them.
    assert torch.equal(tunedist.all_reduce(torch.ones(3), dist.ReduceOp(dist.ReduceOp.SUM)), torch.full((3,), 2.0))
    # Complex tensors as dist.all_reduce treats them: SUM/AVG on the real and imaginary parts; MAX refused before the
    # group sees it (the group stays usable).
    c = torch.complex(torch.full((6,), float(rank + 1)), torch.full((6,), -1.0))
    tunedist.all_reduce(c)
    assert torch.equal(c, torch.complex(torch.full((6,), 3.0), torch.full((6,), -2.0))), c
    with pytest.raises(RuntimeError, match="reduce op 'max' is not supported on complex tensors"):
        tunedist.all_reduce(c, dist.ReduceOp.MAX)
    # A destroyed group is refused, not resolved by its name (a newer group may have taken it).
    stale = dist.new_group(backend="tuned")
    tunedist.all_reduce(torch.ones(2), group=stale)
    dist.destroy_process_group(stale)
    dist.new_group(backend="gloo")
    with pytest.raises(ValueError, match="is not a live process group"):
        tunedist.all_reduce(torch.ones(2), group=stale)
    with pytest.raises(ValueError, match="is not a live process group"):
        tunedist.broadcast(torch.ones(2), src=0, group=stale)
    assert torch.equal(tunedist.all_reduce(torch.ones(2)), torch.full((2,), 2.0))
    # Shapes only: a meta tensor comes back as it went in (torch.compile traces through this kernel).
    m = torch.empty(5, 3, device="meta")
    torch.ops.tunedist.all_reduce_(m, "sum", dist.group.WORLD.group_name)
    assert m.is_meta and m.shape == (5, 3)
    return seen


def test_bad_arguments_get_clear_errors():
    results = launch(2, _bad_arguments)
    assert all(len(r) == 4 for r in results), results


def test_no_default_group():
    import tunedist

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="default process group has not been initialized"):
        tunedist.all_reduce(torch.ones(4))


def _compiled(rank: int, world: int) -> list:
    import tunedist

    def layer(x):
        y = x * 2
        tunedist.all_reduce(y)
        gathered = torch.empty(world * y.numel())
        tunedist.all_gather_into_tensor(gathered, y)
        return gathered.view(world, -1).sum(0) / world + 1

    # aot_eager: torch.compile's tracing and functionalization (which refuse a mutating operator that returns an
    # alias of its input), without code generation.
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.arange(6, dtype=torch.float32)
    got = compiled(x)
    assert torch.equal(got, x * 2 * world + 1), got
    return got.tolist()


def _compiled_groups(rank: int, world: int) -> list:
    """Compiled code called with one group, then another, runs on each (the group's name is not baked into the
    graph), and a collective whose result nobody reads still runs (it has side effects)."""
    import tunedist

    g1, g2 = dist.new_group(backend="tuned"), dist.new_group(backend="tuned")

    def f(x, g):
        y = x.clone()
        tunedist.all_reduce(y, group=g)
        return x + 1

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    seq1, seq2 = g1._get_sequence_number_for_group, g2._get_sequence_number_for_group
    before = (seq1(), seq2())
    compiled(torch.ones(4), g1)
    compiled(torch.ones(4), g2)
    compiled(torch.ones(4), g2)
    return [seq1() - before[0], seq2() - before[1]]


def test_torch_compile_keeps_the_group_and_the_call():
    assert launch(2, _compiled_groups) == [[1, 2], [1, 2]]


def test_torch_compile_traces_it():
    results = launch(2, _compiled)
    assert results[0] == results[1] == [1.0, 5.0, 9.0, 13.0, 17.0, 21.0], results
