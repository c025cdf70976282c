"""dist.monitored_barrier on the ``tuned`` backend, in real processes: it passes when every rank arrives (and leaves
the group usable), and when ranks skip it, rank 0 names them (the first, or all with ``wait_all_ranks=True``) and
every rank that waited fails within the timeout, as with gloo.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_utils import launch

BARRIER_TIMEOUT = timedelta(seconds=2)
# What torch's own tests look for in a timeout's message.
TORCH_TIMEOUT_REGEX = " (Timed out|closed|timeout) "


def _passes(rank: int, world_size: int) -> float:
    for wait_all in (False, True, False):
        dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=wait_all)
    # The group still runs collectives and point-to-point afterwards.
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    dist.monitored_barrier(timeout=BARRIER_TIMEOUT)
    if rank == 0:
        dist.send(torch.ones(2), 1)
    elif rank == 1:
        got = torch.zeros(2)
        dist.recv(got, 0)
        assert got.tolist() == [1.0, 1.0]
    dist.barrier()
    return t[0].item()


@pytest.mark.parametrize("world_size", [2, 3])
def test_monitored_barrier_passes(world_size):
    expected = world_size * (world_size + 1) / 2
    assert launch(world_size, _passes) == [expected] * world_size


def _skips(rank: int, world_size: int, skipping: list[int], wait_all: bool) -> tuple[str, float]:
    # The skipping ranks wait until the others are done, so nobody leaves the group early.
    store = dist.distributed_c10d._get_default_store()
    msg, elapsed = "no error", 0.0
    if rank not in skipping:
        start = time.monotonic()
        try:
            dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=wait_all)
        except RuntimeError as e:
            msg = str(e)
        elapsed = time.monotonic() - start
        store.add("mb_failed", 1)
    while store.add("mb_failed", 0) < world_size - len(skipping):
        time.sleep(0.05)
    # Rank 0 hosts the store: it leaves last.
    store.add("mb_left", 1)
    while rank == 0 and store.add("mb_left", 0) < world_size:
        time.sleep(0.05)
    return msg, elapsed


def _check_waiters(results, skipping):
    for rank, (msg, elapsed) in enumerate(results):
        if rank in skipping:
            continue
        assert "monitored_barrier" in msg and re.search(TORCH_TIMEOUT_REGEX, msg), f"rank {rank}: {msg}"
        assert "2000 ms" in msg, f"rank {rank}: {msg}"
        # Never past the timeout by more than the polling and start-up slack.
        assert elapsed < 10.0, f"rank {rank} waited {elapsed:.1f} s with a 2 s timeout: {msg}"


def test_monitored_barrier_names_the_missing_rank():
    results = launch(3, _skips, [2], False)
    _check_waiters(results, [2])
    assert re.search(r"\brank 2 did not arrive", results[0][0]), results[0][0]


def test_monitored_barrier_wait_all_ranks_names_every_missing_rank():
    results = launch(4, _skips, [1, 3], True)
    _check_waiters(results, [1, 3])
    assert "ranks 1, 3 did not arrive" in results[0][0], results[0][0]


def test_monitored_barrier_first_missing_rank_only_without_wait_all():
    results = launch(4, _skips, [1, 3], False)
    _check_waiters(results, [1, 3])
    assert re.search(r"\brank 1 did not arrive", results[0][0]), results[0][0]
    assert "3" not in results[0][0].split("did not arrive")[0].split("ms:")[-1], results[0][0]
