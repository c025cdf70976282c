"""dist.gather_single (and its older name gather_into_tensor) on `tuned`: every rank's input into one flat output on
the root, at world sizes 2 and 3, on one host and on two simulated hosts (TUNEDIST_HOST_ID), for every dtype the
other collectives take, every root, empty to multi-slot sizes, a flat or a stacked output, synchronous and async.
Each block is checked bit for bit against the deterministic input of the rank that sent it. gloo refuses the call."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_utils import expect_error, free_port, init_url, launch, make_input, mismatch

pytestmark = pytest.mark.skipif(not hasattr(dist, "gather_single"), reason="this torch has no dist.gather_single")

# The dtypes the other collectives take (README): gloo, which carries a group across hosts, has no complex types.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool)
# 300_001 elements: more than one 1 MiB slot for the 4- and 8-byte types, so the engine's gather runs in chunks.
SIZES = (0, 1, 1001, 300_001)


def _input(dtype: torch.dtype, n: int, rank: int, tag: str) -> torch.Tensor:
    return make_input(dtype, n, rank, tag)


def _gather_everything(rank: int, world: int, hosts: list | None) -> list[str]:
    if hosts is not None:
        os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[rank]}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    problems = []
    for root in range(world):
        for dtype in DTYPES:
            for n in SIZES:
                tag = f"gs{root}{n}"
                t = _input(dtype, n, rank, tag)
                stacked = n == 1001  # dist.gather_single takes a flat or a [world, *shape] output
                out = None
                if rank == root:
                    out = torch.full((world, n) if stacked else (world * n,), 7, dtype=dtype)
                if n == 1 and dtype == torch.float32:
                    work = dist.gather_single(t, out, dst=root, async_op=True)
                    work.wait()
                elif n == 0 and dtype == torch.int64:
                    dist.gather_into_tensor(t, out, dst=root)
                else:
                    dist.gather_single(t, out, dst=root)
                if rank != root:
                    continue
                flat = out.reshape(-1)
                for p in range(world):
                    problem = mismatch(flat[p * n:(p + 1) * n], _input(dtype, n, p, tag))
                    if problem:
                        problems.append(f"rank {rank}: root={root} {dtype} n={n} block {p}: {problem}")
    # a group that spans a subset of ranks, and the input that is a view of the root's own block
    sub = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        out = torch.zeros(2 * 5)
        mine = out[5:] if rank == world - 1 else torch.full((5,), 1.0)
        if rank == world - 1:
            mine.fill_(2.0)
        dist.gather_single(mine, out if rank == world - 1 else None, group=sub, group_dst=1)
        if rank == world - 1 and out.tolist() != [1.0] * 5 + [2.0] * 5:
            problems.append(f"rank {rank}: sub-group gather_single gave {out.tolist()}")
    return problems


@pytest.mark.parametrize("world,hosts", [
    pytest.param(2, None, id="ws2-one-host"),
    pytest.param(3, None, id="ws3-one-host"),
    pytest.param(2, [0, 1], id="ws2-two-hosts"),
    pytest.param(3, [0, 1, 0], id="ws3-two-hosts"),
])
def test_gather_single_closed_form(world, hosts):
    results = launch(world, _gather_everything, hosts, init=False)
    problems = [p for r in results for p in r]
    assert not problems, "\n".join(problems[:30])


def _refusals(rank: int, world: int, port: int) -> dict:
    dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world)
    got = {}
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4)
    if rank == 0:
        # a non-contiguous output on the root: refused on the root, and its peers learn of the failure
        got["strided"], _ = expect_error(dist.gather_single, t, torch.empty(world * 4, 2)[:, 0], dst=0,
                                         expected=RuntimeError)
        store.wait([f"reported{r}" for r in range(1, world)])  # rank 0 hosts the store: keep it up until then
    else:
        got["peer"], _ = expect_error(dist.gather_single, t, None, dst=0, expected=RuntimeError)
        store.set(f"reported{rank}", "1")
    return got


def test_gather_single_refuses_a_strided_output_naming_op_and_rank():
    results = launch(2, _refusals, free_port(), init=False, return_exceptions=True)
    assert "gather_single" in results[0]["strided"] and "rank 0" in results[0]["strided"], results[0]
    assert "contiguous" in results[0]["strided"], results[0]
    assert "gather_single" in results[1]["peer"], results[1]


def _gloo(rank: int, world: int) -> str:
    out = torch.empty(world * 3) if rank == 0 else None
    message, _ = expect_error(dist.gather_single, torch.ones(3), out, dst=0, expected=RuntimeError)
    return message


def test_gloo_does_not_support_gather_single():
    """What the feature table says beside tuned's row."""
    for message in launch(2, _gloo, backend="gloo"):
        assert "does not support gather_single" in message, message
