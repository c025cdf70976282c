"""A stopped rank is a slow rank, not a dead one.

A rank stopped with SIGSTOP (what a debugger attach, ``py-spy dump``, ``docker pause``, the cgroup freezer or a
scheduler's preemption signal do) keeps its life lock (csrc/core/sync.h), so its peers wait for it like for any slow
rank. Here rank 0 stops the victim while a peer waits for it inside the one-shot and two-shot all_reduce and a
send/recv (3 s), and the cross-host all_reduce of two simulated hosts (10 s), then lets it continue:
every operation completes with the right result. Both stops are several times the 1 s after which a silent
heartbeat would count (TUNEDIST_DEAD_AFTER_MS, consulted only where the life lock cannot tell), so each path is
checked once rather than at both lengths. A rank stopped past the group's timeout gives the timeout error that
names it, not "dead". No test asserts a speed; the group timeout (300 s) is far above the stops.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_utils import init_url, launch

GROUP_TIMEOUT_S = 300.0
LAUNCH_TIMEOUT_S = 240.0
# The victim sleeps this long after the barrier before it calls the operation; rank 0 stops it at once, so rank 0
# then waits for a stopped rank inside the operation.
SETTLE_S = 0.3
SMALL = 16  # float32 elements: the one-shot all_reduce
LARGE = 1 << 20  # 4 MiB of float32: the two-shot all_reduce (above the 256 KiB one-shot limit)


def _stop_for(pid: int, seconds: float) -> threading.Thread:
    """SIGSTOPs `pid` now and SIGCONTs it after `seconds`, from a thread; returns the thread."""
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Thread(target=lambda: (time.sleep(seconds), os.kill(pid, signal.SIGCONT)), daemon=True)
    resume.start()
    return resume


def _all_reduce_checked(numel: int, group=None) -> None:
    world = dist.get_world_size(group)
    x = torch.full((numel,), float(dist.get_rank() + 1))
    dist.all_reduce(x, group=group)
    expected = float(world * (world + 1) // 2)
    assert torch.equal(x, torch.full((numel,), expected)), f"all_reduce of {numel} gave {x[:4]}, expected {expected}"


def _one_host_worker(rank: int, world_size: int, stop_s: float) -> dict:
    """Rank 0 stops rank 1 right after a barrier and then waits for it inside each path."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{rank}", str(os.getpid()))
    victim = int(store.get("pid1")) if rank == 0 else 0
    _all_reduce_checked(SMALL)  # attach the segment and warm up both algorithms and the rings
    _all_reduce_checked(LARGE)
    token = torch.zeros(4)
    if rank == 0:
        dist.send(torch.ones(4), 1)
        dist.recv(token, 1)
    else:
        dist.recv(token, 0)
        dist.send(token, 0)
    waited = {}
    for path, numel in (("one_shot", SMALL), ("two_shot", LARGE)):
        dist.barrier()
        if rank == 0:
            resume = _stop_for(victim, stop_s)
            t0 = time.monotonic()
            _all_reduce_checked(numel)
            waited[path] = time.monotonic() - t0
            resume.join()
        else:
            time.sleep(SETTLE_S)
            _all_reduce_checked(numel)
    # p2p: rank 0 sends to the stopped rank 1, then waits for its reply.
    dist.barrier()
    if rank == 0:
        resume = _stop_for(victim, stop_s)
        t0 = time.monotonic()
        dist.send(torch.full((4,), 7.0), 1)
        reply = torch.zeros(4)
        dist.recv(reply, 1)
        waited["p2p"] = time.monotonic() - t0
        resume.join()
        assert torch.equal(reply, torch.full((4,), 8.0)), reply
    else:
        time.sleep(SETTLE_S)
        got = torch.zeros(4)
        dist.recv(got, 0)
        dist.send(got + 1, 0)
    dist.barrier()
    return waited


def _cross_host_worker(rank: int, world_size: int, stop_s: float) -> dict:
    """2 simulated hosts x 2 ranks; rank 0 stops rank 2 (the other host's leader) during the cross-host all_reduce."""
    os.environ["TUNEDIST_HOST_ID"] = f"host{rank // 2}"
    port = int(os.environ["MASTER_PORT"])
    dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{rank}", str(os.getpid()))
    victim = int(store.get("pid2")) if rank == 0 else 0
    _all_reduce_checked(LARGE)  # make the gloo groups between hosts
    dist.barrier()
    waited = {}
    if rank == 0:
        resume = _stop_for(victim, stop_s)
        t0 = time.monotonic()
        _all_reduce_checked(LARGE)
        waited["cross_host"] = time.monotonic() - t0
        resume.join()
    else:
        if rank == 2:
            time.sleep(SETTLE_S)
        _all_reduce_checked(LARGE)
    dist.barrier()
    return waited


def _past_timeout_worker(rank: int, world_size: int) -> str:
    """Rank 1 is stopped for twice a 3 s group timeout while rank 0 waits for it: rank 0 times out naming it."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{rank}", str(os.getpid()))
    group = dist.new_group(backend="tuned", timeout=timedelta(seconds=3))
    _all_reduce_checked(SMALL, group)
    dist.barrier()
    message = ""
    if rank == 0:
        resume = _stop_for(int(store.get("pid1")), 6.0)
        try:
            _all_reduce_checked(SMALL, group)
        except RuntimeError as exc:
            message = str(exc)
        resume.join()
        store.set("rank0_done", "1")
    else:
        store.wait(["rank0_done"], timedelta(seconds=120))
    dist.destroy_process_group(group)
    return message


@pytest.mark.parametrize("stop_s", [3.0])
def test_stopped_rank_is_slow_not_dead_on_one_host(stop_s):
    waited = launch(2, _one_host_worker, stop_s, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S)[0]
    assert set(waited) == {"one_shot", "two_shot", "p2p"}
    for path, seconds in waited.items():
        # Rank 0 really waited for the stopped rank inside the path (the stop minus the settle time).
        assert seconds >= stop_s - SETTLE_S - 0.5, f"{path}: waited only {seconds:.2f} s for a {stop_s} s stop"


@pytest.mark.parametrize("stop_s", [10.0])
def test_stopped_rank_is_slow_not_dead_across_hosts(stop_s):
    waited = launch(4, _cross_host_worker, stop_s, init=False, timeout_s=LAUNCH_TIMEOUT_S)[0]
    assert waited["cross_host"] >= stop_s - SETTLE_S - 0.5, waited


def test_rank_stopped_past_the_timeout_times_out_naming_it():
    message = launch(2, _past_timeout_worker, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S)[0]
    assert "all_reduce" in message and re.search(r"ranks? \[?1\b", message), message
    assert "timed out" in message.lower(), message
    assert "dead" not in message, message
