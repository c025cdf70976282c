"""dist.monitored_barrier on the ``tuned`` backend, in real processes.

* PyTorch's own monitored_barrier tests (torch/testing/_internal/distributed/distributed_test.py:
  test_monitored_barrier_gloo, _gloo_subgroup, _gloo_rank_0_timeout, _failure_order, _wait_all_ranks), their
  steps and regular expressions copied as they are there, run on ``tuned`` (``test_torch_*``).
* It passes when every rank arrives and leaves the group usable; rank 0 names the ranks that skipped it (the first,
  or all with ``wait_all_ranks=True``) and every rank that waited fails too, with tuned's detail after gloo's words.
* A zero timeout is zero: rank 0 raises at once, as gloo does.
* No rank leaves before every rank can: two barriers then destroy_process_group, repeated in plain processes (rank 0
  hosts the TCP store and closes it as it leaves), fails no repetition; and a rank that gave up waiting for rank 0
  makes every rank fail, none pass.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import launch

REPO = Path(__file__).resolve().parents[2]
BARRIER_TIMEOUT = timedelta(seconds=2)
# gloo's sentence for a rank > 0 whose barrier failed because rank 0's did.
PEER_FAILED = ("Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for send/recv "
               "from rank 0")


def _store_barrier(name: str, world_size: int) -> None:
    """What torch's tests call self._barrier(): every rank waits on the default store until all got here; rank 0,
    which hosts the store, leaves last."""
    store = dist.distributed_c10d._get_default_store()
    store.add(f"{name}/in", 1)
    while store.add(f"{name}/in", 0) < world_size:
        time.sleep(0.01)
    store.add(f"{name}/out", 1)
    while store.add(f"{name}/out", 0) < world_size and dist.get_rank() == 0:
        time.sleep(0.01)


def _raises(regex: str, fn, *args, **kwargs) -> str:
    """assertRaisesRegex(RuntimeError, regex): returns the message."""
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        assert re.search(regex, str(e)), f"{regex!r} not in: {e}"
        return str(e)
    raise AssertionError(f"no RuntimeError matching {regex!r}")


# ---- torch's tests, ported ----


def _torch_gloo(rank: int, world_size: int) -> str:
    tensors = [torch.ones(10) * rank]
    for _ in range(10):
        dist.all_reduce(torch.cat(tensors))
    timeout = timedelta(seconds=2)
    dist.monitored_barrier(timeout=timeout)
    for _ in range(10):
        dist.all_reduce(torch.cat(tensors))
    dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
    failed_rank, src_rank, msg = 1, 0, ""
    if rank == src_rank:
        msg = _raises(f"Rank {failed_rank} failed to pass monitoredBarrier", dist.monitored_barrier, timeout=timeout)
    elif rank != failed_rank:
        err_regex = (f"Rank {rank} successfully reached monitoredBarrier,"
                     f" but received errors while waiting for send/recv from rank"
                     f" {src_rank}")
        msg = _raises(err_regex, dist.monitored_barrier, timeout=timeout)
    _store_barrier("torch_gloo", world_size)
    return msg


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_monitored_barrier_gloo(world_size):
    msgs = launch(world_size, _torch_gloo)
    assert "tunedist: rank 1 of" in msgs[0] and "did not arrive" in msgs[0], msgs[0]
    for rank in range(2, world_size):
        assert "rank 0 reported: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms" in msgs[rank], msgs[rank]


def _torch_subgroup(rank: int, world_size: int) -> str:
    failed_rank = 1
    timeout = 0.1
    subgroup = dist.new_group(ranks=[0, 1])
    msg = ""
    if rank == 0:
        msg = _raises(f"Rank {failed_rank} failed to pass monitoredBarrier", dist.monitored_barrier, subgroup, timeout)
    elif rank != failed_rank:
        dist.monitored_barrier(subgroup, timeout)
    _store_barrier("torch_subgroup", world_size)
    return msg


def test_torch_monitored_barrier_gloo_subgroup():
    msgs = launch(3, _torch_subgroup)
    assert "in 100 ms" in msgs[0], msgs[0]


def _torch_rank_0_timeout(rank: int, world_size: int) -> str:
    process_group = dist.new_group(ranks=list(range(world_size)))
    timeout = timedelta(seconds=0)
    msg = ""
    if rank == 0:
        msg = _raises(f"Rank {rank} timed out in monitoredBarrier", process_group.monitored_barrier, timeout)
    _store_barrier("torch_rank_0_timeout", world_size)
    return msg


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_monitored_barrier_gloo_rank_0_timeout(world_size):
    msgs = launch(world_size, _torch_rank_0_timeout)
    assert "after 0 ms" in msgs[0] and "No ranks successfully processed" in msgs[0], msgs[0]


def _torch_failure_order(rank: int, world_size: int) -> str:
    expected_first_failed_rank = 2
    timeout = timedelta(seconds=2)
    src_rank, msg = 0, ""
    if rank == src_rank:
        msg = _raises(f"Rank {expected_first_failed_rank}", dist.monitored_barrier, timeout=timeout)
    elif rank == 1:
        err_regex = (f"Rank {rank} successfully reached monitoredBarrier,"
                     f" but received errors while waiting for send/recv from rank"
                     f" {src_rank}")
        msg = _raises(err_regex, dist.monitored_barrier, timeout=timeout)
    _store_barrier("torch_failure_order", world_size)
    return msg


@pytest.mark.parametrize("world_size", [3, 4])
def test_torch_monitored_barrier_failure_order(world_size):
    msgs = launch(world_size, _torch_failure_order)
    # The first missing rank only: 2, not 3.
    assert msgs[0].startswith("[Rank 0]: Rank 2 failed to pass monitoredBarrier in 2000 ms"), msgs[0]


def _torch_wait_all_ranks(rank: int, world_size: int) -> str:
    msg = ""
    if rank == 0:
        timeout = timedelta(seconds=0.1)
        rank_str = ", ".join([str(i) for i in range(1, int(world_size))])
        err_regex = f"Ranks {rank_str} failed to pass monitoredBarrier"
        msg = _raises(err_regex, dist.monitored_barrier, timeout=timeout, wait_all_ranks=True)
    _store_barrier("torch_wait_all_ranks", world_size)
    return msg


@pytest.mark.parametrize("world_size", [3, 4])
def test_torch_monitored_barrier_wait_all_ranks(world_size):
    msgs = launch(world_size, _torch_wait_all_ranks)
    assert msgs[0].startswith("[Rank 0]: Ranks "), msgs[0]


# ---- tuned's own ----


def _passes(rank: int, world_size: int) -> float:
    for wait_all in (False, True, False):
        dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=wait_all)
    # The group still runs collectives and point-to-point afterwards.
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    dist.monitored_barrier(timeout=BARRIER_TIMEOUT)
    if rank == 0 and world_size > 1:
        dist.send(torch.ones(2), 1)
    elif rank == 1:
        got = torch.zeros(2)
        dist.recv(got, 0)
        assert got.tolist() == [1.0, 1.0]
    dist.barrier()
    return t[0].item()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_monitored_barrier_passes(world_size):
    expected = world_size * (world_size + 1) / 2
    assert launch(world_size, _passes) == [expected] * world_size


def _skips(rank: int, world_size: int, skipping: list[int], wait_all: bool) -> str:
    msg = "no error"
    if rank not in skipping:
        try:
            dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=wait_all)
        except RuntimeError as e:
            msg = str(e)
    _store_barrier("skips", world_size)
    return msg


def _check_waiters(msgs, skipping, root_words):
    assert msgs[0].startswith(root_words), msgs[0]
    for rank, msg in enumerate(msgs):
        if rank in skipping or rank == 0:
            continue
        assert msg.startswith(PEER_FAILED.format(rank=rank)), f"rank {rank}: {msg}"
        # The rank learns rank 0's verdict, with rank 0's words.
        assert f"rank 0 reported: {root_words}" in msg, f"rank {rank}: {msg}"


def test_monitored_barrier_names_the_missing_rank():
    msgs = launch(3, _skips, [2], False)
    _check_waiters(msgs, [2], "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 2000 ms")
    assert "rank 2 of 3 did not arrive" in msgs[0], msgs[0]


def test_monitored_barrier_wait_all_ranks_names_every_missing_rank():
    msgs = launch(4, _skips, [1, 3], True)
    _check_waiters(msgs, [1, 3], "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms")
    assert "ranks 1, 3 of 4 did not arrive" in msgs[0], msgs[0]


def test_monitored_barrier_wait_all_ranks_one_missing_rank():
    # gloo's plural even for one rank, which torch's own test matches at world size 2 ("Ranks 1 failed").
    msgs = launch(3, _skips, [1], True)
    _check_waiters(msgs, [1], "[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 2000 ms")


def test_monitored_barrier_first_missing_rank_only_without_wait_all():
    msgs = launch(4, _skips, [1, 3], False)
    _check_waiters(msgs, [1, 3], "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms")
    assert "rank 1 of 4 did not arrive" in msgs[0] and "3" not in msgs[0].split(" of 4")[0], msgs[0]


def _zero_timeout(rank: int, world_size: int) -> str:
    # Every rank calls with a zero timeout: rank 0 has no time to wait for anyone and raises at once, as gloo does
    # (not after the group's 90 s); the others learn its verdict.
    msg = ""
    try:
        dist.monitored_barrier(timeout=timedelta(0))
    except RuntimeError as e:
        msg = str(e)
    _store_barrier("zero", world_size)
    return msg


def test_monitored_barrier_zero_timeout_raises_at_once():
    msgs = launch(3, _zero_timeout)
    assert msgs[0].startswith("Rank 0 timed out in monitoredBarrier after 0 ms."), msgs[0]
    for rank in (1, 2):
        assert msgs[rank].startswith(PEER_FAILED.format(rank=rank)), msgs[rank]


def _peer_gives_up(rank: int, world_size: int) -> str:
    # The group's timeout (set to 1 s here) bounds how long a rank > 0 waits for rank 0's verdict; rank 0 comes only
    # after rank 1 gave up, finds every rank arrived, but may not release: rank 1 left without passing.
    store = dist.distributed_c10d._get_default_store()
    dist.set_timeout(timedelta(seconds=1))
    msg = ""
    try:
        if rank == 0:
            while not store.check(["gave_up"]):
                time.sleep(0.01)
        dist.monitored_barrier(timeout=timedelta(seconds=1))
    except RuntimeError as e:
        msg = str(e)
    if rank == 1:
        store.set("gave_up", "1")
    _store_barrier("gave_up_done", world_size)
    dist.set_timeout(timedelta(seconds=90))
    # The group is still usable.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [world_size] * 3
    return msg


def test_monitored_barrier_rank_that_gives_up_fails_every_rank():
    msgs = launch(2, _peer_gives_up)
    assert msgs[1].startswith(PEER_FAILED.format(rank=1)), msgs[1]
    assert "Timed out after 1000 ms waiting for rank 0" in msgs[1], msgs[1]
    assert msgs[0].startswith("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"), msgs[0]
    assert "ran out before rank 0 released it" in msgs[0], msgs[0]


def _bench_reps(world_size: int, reps: int, backend: str = "tuned") -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # PYTHONPATH (conftest's, if set) is kept
    out = REPO / "build" / f"mb_reps_{world_size}_{os.getpid()}.json"
    out.parent.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "benchmarks/bench_monitored_barrier.py", "--world-size", str(world_size),
                           "--reps", str(reps), "--backend", backend, "--json", str(out)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert out.exists(), proc.stdout[-4000:]
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize("world_size", [2, 3])
def test_monitored_barrier_then_destroy_repeated(world_size):
    """Two monitored barriers, then destroy_process_group, 50 times in plain processes: no repetition fails."""
    result = _bench_reps(world_size, 50)
    assert result["reps"] == 50 and result["world_size"] == world_size
    assert result["failures"] == 0, result["errors"][:5]
    assert result["exit_codes"] == [0] * world_size
