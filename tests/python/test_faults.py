"""Failure handling of the ``tuned`` backend with real processes: dead peers, slow peers, timeouts, ranks that
disagree, caller errors on one rank, torchrun restarts and abort.

Groups run with a 300 s timeout unless a test says otherwise, so an error that arrives within a few seconds shows
that the backend detected the fault itself rather than timing out. No test asserts speed otherwise.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import threading
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_utils import RankFailure, assert_no_new_shm, expect_error, launch, shm_entries
from fault_workers import read_results, run_torchrun

GROUP_TIMEOUT_S = 300.0
# "Fast" below means: well before the group timeout, generously above what a loaded 2-core machine needs.
FAST_S = 60.0
LAUNCH_TIMEOUT_S = 150.0


# ---------------------------------------------------------------------------------------------------------------
# Dead peer

# Sequence numbers count this group's operations from 1: seq 1 is the warm-up (it attaches the segment), seq 2 is
# the operation rank 1 dies in.
VICTIM_SEQ = 2
# (elements, publish step to stall at): one-shot has one publish; the 32 MiB two-shot stalls at the first publish
# of its second one-slot chunk, so the peers have already exchanged data with rank 1 in this operation.
DEAD_PEER_CASES = {"one_shot": (1024, 1), "two_shot": (8 << 20, 3)}


def _dead_peer_worker(rank: int, world_size: int, numel: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    x = torch.full((numel,), float(rank + 1))
    dist.all_reduce(x)  # seq 1
    assert dist.group.WORLD._get_sequence_number_for_group() == VICTIM_SEQ - 1
    if rank == 1:
        store.set("victim_pid", str(os.getpid()))
        dist.all_reduce(x)  # stalls (TUNEDIST_TEST_STALL) before a publish, and is killed there
        raise AssertionError("rank 1 finished an all_reduce it should have died in")
    if rank == 0:
        victim = int(store.get("victim_pid"))

        def kill_victim():
            time.sleep(1.5)  # rank 1 is inside its 120 s stall by now
            store.set("kill_time", repr(time.monotonic()))  # CLOCK_MONOTONIC is shared by the host's processes
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_victim, daemon=True).start()
    message, elapsed = expect_error(dist.all_reduce, x)
    failed_at = time.monotonic()
    latency = failed_at - float(store.get("kill_time"))
    store.set(f"read_kill_time_{rank}", "1")
    if rank == 0:  # rank 0 hosts the store: keep it up until rank 2 has read the kill time
        store.wait([f"read_kill_time_{r}" for r in range(2, world_size)])
    later_message, later_s = expect_error(dist.all_reduce, torch.ones(4))
    t0 = time.monotonic()
    dist.destroy_process_group()
    return {"message": message, "elapsed": elapsed, "latency": latency, "later": later_message,
            "later_s": later_s, "destroy_s": time.monotonic() - t0}


@pytest.mark.parametrize("case", list(DEAD_PEER_CASES))
def test_dead_peer_fails_survivors_fast(case):
    numel, step = DEAD_PEER_CASES[case]
    before = shm_entries()
    results = launch(3, _dead_peer_worker, numel, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S,
                     return_exceptions=True, env={"TUNEDIST_TEST_STALL": f"1:{VICTIM_SEQ}:{step}:120000"})
    victim = results[1]
    assert isinstance(victim, RankFailure) and victim.exitcode == -signal.SIGKILL, (
        f"rank 1 should have been SIGKILLed inside the stall: {victim}")
    for rank in (0, 2):
        res = results[rank]
        assert not isinstance(res, RankFailure), str(res)
        msg = res["message"]
        assert "all_reduce" in msg and f"seq {VICTIM_SEQ}" in msg and "rank 1" in msg, msg
        assert res["elapsed"] < FAST_S, f"rank {rank} waited {res['elapsed']:.1f} s: {msg}"
        assert "earlier failure" in res["later"], res["later"]
        assert res["later_s"] < 5.0, f"a call on the failed group took {res['later_s']:.1f} s"
        assert res["destroy_s"] < FAST_S
        print(f"[{case}] rank {rank}: dead peer detected {res['latency'] * 1e3:.0f} ms after SIGKILL "
              f"(the call failed after {res['elapsed']:.2f} s)")
    assert_no_new_shm(before)


# ---------------------------------------------------------------------------------------------------------------
# Slow peer, timeout


def _slow_peer_worker(rank: int, world_size: int) -> float:
    # A slow peer is alive (its heartbeat runs): no deadAfter-based verdict while others wait for its call.
    if rank == 1:
        time.sleep(3.0)
    x = torch.ones(8)
    dist.all_reduce(x)  # the first call attaches the segment
    assert torch.equal(x, torch.full((8,), float(world_size)))
    if rank == 1:
        time.sleep(3.0)
    dist.all_reduce(x)
    return float(x[0])


def test_slow_peer_is_not_dead():
    assert launch(2, _slow_peer_worker, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S) == [4.0, 4.0]


TIMEOUT_CASES = {"while_attaching": False, "in_protocol": True}  # name: warm up the group first?


def _timeout_worker(rank: int, world_size: int) -> dict:
    # Each case gets a fresh group with a 3 s timeout, in which rank 1 never calls the all_reduce rank 0 waits in.
    store = dist.distributed_c10d._get_default_store()
    results = {}
    for name, warm_up in TIMEOUT_CASES.items():
        group = dist.new_group(backend="tuned", timeout=timedelta(seconds=3))
        if warm_up:
            dist.all_reduce(torch.ones(4), group=group)
        if rank == 0:
            results[name] = expect_error(dist.all_reduce, torch.ones(4), group=group)
            store.set(f"{name}_done", "1")
        else:
            store.wait([f"{name}_done"], timedelta(seconds=60))
        dist.destroy_process_group(group)
    return results


@functools.cache
def _runs_of(worker):
    """One 2-rank launch of `worker` shared by all its parametrized cases; re-raises the launch failure in each."""
    try:
        return launch(2, worker, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - cached so every case reports it without relaunching
        return exc


@pytest.mark.parametrize("case", list(TIMEOUT_CASES))
def test_timeout_names_missing_rank(case):
    runs = _runs_of(_timeout_worker)
    if isinstance(runs, Exception):
        raise runs
    msg, elapsed = runs[0][case]
    assert "Timed out" in msg and re.search(r"ranks \[1\]|rank 1\b", msg), msg
    assert 2.5 <= elapsed < 30.0, f"timed out after {elapsed:.1f} s with a 3 s timeout: {msg}"


# What torch's own tests and users' tooling look for in a timeout's message (torch.testing._internal's
# distributed tests match errors against this).
TORCH_TIMEOUT_REGEX = " (Timed out|closed|timeout) "


@pytest.mark.parametrize("case", list(TIMEOUT_CASES))
def test_timeout_message_matches_torch_regex(case):
    # "while_attaching" is the group's first collective: the peer never attaches its shared memory.
    runs = _runs_of(_timeout_worker)
    if isinstance(runs, Exception):
        raise runs
    msg, _ = runs[0][case]
    assert re.search(TORCH_TIMEOUT_REGEX, msg), msg


# ---------------------------------------------------------------------------------------------------------------
# Ranks that disagree: each case runs in a fresh group (which it leaves failed); the default group stays healthy.


def _mismatch_size(rank, g):
    dist.all_reduce(torch.ones(4 + rank), group=g)


def _mismatch_size_across_algorithms(rank, g):
    dist.all_reduce(torch.ones(1000 if rank == 0 else 300_000), group=g)  # one-shot vs two-shot


def _mismatch_dtype(rank, g):
    dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64), group=g)


def _mismatch_reduce_op(rank, g):
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX, group=g)


def _mismatch_root(rank, g):
    dist.broadcast(torch.ones(4), src=rank, group=g)


def _mismatch_op(rank, g):
    if rank == 0:
        dist.all_reduce(torch.ones(4), group=g)
    else:
        dist.broadcast(torch.ones(4), src=0, group=g)


def _mismatch_all_to_all_splits(rank, g):
    out_splits = [2, 2] if rank == 0 else [1, 3]  # rank 1 expects 1 row from rank 0, which sends 2
    dist.all_to_all_single(torch.empty(4), torch.ones(4), output_split_sizes=out_splits,
                           input_split_sizes=[2, 2], group=g)


MISMATCHES = {f.__name__.removeprefix("_mismatch_"): f for f in (
    _mismatch_size, _mismatch_size_across_algorithms, _mismatch_dtype, _mismatch_reduce_op, _mismatch_root,
    _mismatch_op, _mismatch_all_to_all_splits)}


def _mismatch_worker(rank: int, world_size: int) -> dict:
    results = {}
    for name, call in MISMATCHES.items():
        group = dist.new_group(backend="tuned", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        dist.all_reduce(torch.ones(1), group=group)  # healthy first: the mismatch is not in attaching
        try:
            results[name] = expect_error(call, rank, group)
        except AssertionError as exc:
            results[name] = (f"no error: {exc}", 0.0)
        dist.destroy_process_group(group)
        # Other groups are unaffected.
        x = torch.ones(2)
        dist.all_reduce(x)
        assert x.tolist() == [float(world_size)] * 2
    return results


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_fails_every_rank(case):
    runs = _runs_of(_mismatch_worker)
    if isinstance(runs, Exception):
        raise runs
    for rank, per_rank in enumerate(runs):
        msg, elapsed = per_rank[case]
        assert "disagree" in msg, f"rank {rank}: {msg}"
        assert elapsed < FAST_S, f"rank {rank} took {elapsed:.1f} s: {msg}"


# ---------------------------------------------------------------------------------------------------------------
# A caller error on one rank only


# Both ranks keep their processes (rank 0's hosts the store) alive up to this long after their own result, so the
# correct rank can learn of the failure only through the backend, not through the store connection breaking.
CALLER_ERROR_BOUND_S = 30.0
# The group timeout of this test: above the bound, so a rank that is never told fails the bound check.
CALLER_ERROR_GROUP_TIMEOUT_S = 60.0
# id: (warm up first?, the rank that passes a bad output list)
CALLER_ERROR_CASES = {"after_warm_up-rank0": (True, 0), "first_collective-rank0": (False, 0),
                      "first_collective-rank1": (False, 1)}


def _caller_error_worker(rank: int, world_size: int, warm_up: bool, bad_rank: int) -> tuple[str, float]:
    store = dist.distributed_c10d._get_default_store()
    if warm_up:
        dist.all_reduce(torch.ones(2))
    x = torch.ones(3)
    outputs = [torch.empty(3) for _ in range(world_size - 1 if rank == bad_rank else world_size)]
    # The bad rank's own call fails validation on its thread (a plain RuntimeError); its peer's fails in the backend.
    result = expect_error(dist.all_gather, outputs, x,
                           expected=RuntimeError if rank == bad_rank else dist.DistBackendError)
    store.set(f"done_{rank}", "1")
    try:
        store.wait([f"done_{1 - rank}"], timedelta(seconds=CALLER_ERROR_BOUND_S))
    except RuntimeError:
        pass
    return result


@pytest.mark.parametrize("case", list(CALLER_ERROR_CASES))
def test_caller_error_on_one_rank_fails_the_other(case):
    """One rank passes an output list of the wrong length to all_gather; the other calls it correctly. The bad rank
    gets the validation error, the other an error naming the bad rank (not a wait until the group timeout)."""
    warm_up, bad = CALLER_ERROR_CASES[case]
    results = launch(2, _caller_error_worker, warm_up, bad, pg_timeout_s=CALLER_ERROR_GROUP_TIMEOUT_S,
                     timeout_s=LAUNCH_TIMEOUT_S)
    (bad_msg, _), (good_msg, good_s) = results[bad], results[1 - bad]
    assert "all_gather" in bad_msg and "output list" in bad_msg, bad_msg
    assert good_s < CALLER_ERROR_BOUND_S, (
        f"rank {1 - bad} waited {good_s:.0f} s for rank {bad}, which failed at once: {good_msg[:600]}")
    assert f"rank {bad}" in good_msg, good_msg


# ---------------------------------------------------------------------------------------------------------------
# Abort


def _abort_worker(rank: int, world_size: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        store.wait(["rank1_waiting"])
        time.sleep(1.0)  # rank 1 is blocked inside the all_reduce below
        abort_error = None
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception:  # noqa: BLE001 - reported by the test
            abort_error = traceback.format_exc()
        return {"abort_error": abort_error}
    store.set("rank1_waiting", "1")
    message, elapsed = expect_error(dist.all_reduce, torch.ones(2))
    return {"message": message, "elapsed": elapsed}


def test_abort_fails_waiting_peer():
    rank0, rank1 = launch(2, _abort_worker, pg_timeout_s=GROUP_TIMEOUT_S, timeout_s=LAUNCH_TIMEOUT_S)
    assert rank0["abort_error"] is None, f"_abort_process_group() raised on the aborting rank:\n{rank0['abort_error']}"
    assert "aborted" in rank1["message"] and "rank 0" in rank1["message"], rank1["message"]
    assert rank1["elapsed"] < FAST_S


# ---------------------------------------------------------------------------------------------------------------
# torchrun restart


def test_torchrun_restart_after_rank_exit(tmp_path):
    """Rank 1 exits abruptly mid-training on the first attempt; torchrun --max-restarts=1 restarts both ranks, which
    re-create the group and finish, leaving nothing in /dev/shm."""
    before = shm_entries()
    rc, out = run_torchrun("restart", tmp_path, max_restarts=1, timeout_s=240)
    assert rc == 0, out[-8000:]
    finished = read_results(tmp_path, "restart")
    assert all(f is not None and f["attempt"] == 1 for f in finished), (finished, out[-4000:])
    assert finished[0]["params"] == finished[1]["params"]
    assert_no_new_shm(before)
