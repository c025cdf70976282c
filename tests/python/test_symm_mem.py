"""torch's own symmetric-memory API (torch.distributed._symmetric_memory) and c10d windows on CPU tensors of a tuned
group, in real processes at world sizes 2 and 3.

One launch per world size runs the in-rank checks of symm_mem_checks.py (allocator, rendezvous and get_buffer, views
and offsets, signals and barriers with timeouts, the tunedist.symmetric_empty heap and a zero-copy all_reduce, the
symm_mem operators, windows, a sub-group); each pytest test reports one section. Values are closed forms of the
ranks' indices. After each launch nothing the job made is left in /dev/shm.

Separately: a peer SIGKILLed while the others wait on its signal (they fail naming it, as a dead peer and not a
timeout, and leave no name in /dev/shm), and the refusals on a gloo group, of a window over memory outside the heap.
No test asserts speed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import symm_mem_checks as checks
from collective_checks import Checker, section_problems
from dist_utils import RankFailure, assert_no_new_shm, launch, meet_on_store, shm_entries

# Small buffers run zero-copy too, so the all_reduce of a symm_mem.empty tensor is counted on the zero-copy path.
ENV = {"TUNEDIST_SYMMETRIC_MIN_BYTES": "0"}
WORLD_SIZES = [pytest.param(n, id=f"w{n}") for n in (2, 3)]
# c10d windows exist from torch 2.14 on (C10D_BACKEND_HAS_WINDOW); torch's symmetric-memory API is older.
HAS_WINDOWS = hasattr(dist.distributed_c10d, "_new_window")
needs_windows = pytest.mark.skipif(not HAS_WINDOWS, reason="this torch's c10d has no windows (_new_window)")


def _run_sections(rank: int, world_size: int) -> dict:
    c = Checker(rank, world_size)
    for name, fn in checks.SECTIONS.items():
        c.run(name, fn)
    return {"failures": dict(c.failures), "digests": dict(c.digests), "ran": c.ran, "seconds": c.seconds}


@pytest.fixture(scope="module", params=WORLD_SIZES)
def matrix(request):
    world_size = request.param
    before = shm_entries()
    try:
        results = launch(world_size, _run_sections, env=ENV, timeout_s=300)
        return world_size, results, None, before
    except AssertionError as exc:
        return world_size, None, exc, before


@pytest.mark.parametrize("section", list(checks.SECTIONS))
def test_symm_mem(matrix, section):
    if section == "windows" and not HAS_WINDOWS:
        pytest.skip("this torch's c10d has no windows (_new_window)")
    world_size, results, error, _ = matrix
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    problems = section_problems(section, world_size, results)
    if problems:
        pytest.fail(f"{section} with world size {world_size}:\n" + "\n".join(problems), pytrace=False)


def test_symm_mem_leaves_no_shm(matrix):
    world_size, _, error, before = matrix
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    assert_no_new_shm(before)


# ---------------------------------------------------------------------------------------------------------------
# A peer killed while the others wait on its signal

VICTIM = 1
WAIT_TIMEOUT_MS = 120_000  # far beyond the dead-peer detection: an error before it is not a timeout


def _killed_while_waited_worker(rank: int, world_size: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    t = symm_mem.empty(4096, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    hdl.barrier()
    if rank == VICTIM:
        # Dies once every other rank is inside its wait for our signal.
        store.wait([f"waiting_{r}" for r in range(world_size) if r != VICTIM])
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    store.set(f"waiting_{rank}", "1")
    start = time.monotonic()
    try:
        hdl.wait_signal(VICTIM, channel=0, timeout_ms=WAIT_TIMEOUT_MS)
        return {"error": None}
    except RuntimeError as exc:
        message = str(exc)
    seconds = time.monotonic() - start
    # The group failed with the death: the next collective fails at once, naming the cause.
    try:
        dist.all_reduce(torch.ones(2))
        after = None
    except RuntimeError as exc:
        after = str(exc)
    return {"error": message, "seconds": seconds, "after": after}


@pytest.mark.parametrize("world_size", [pytest.param(n, id=f"w{n}") for n in (2, 3)])
def test_peer_killed_while_waited_on(world_size):
    """Rank 1 is SIGKILLed while every other rank waits on its signal (timeout 120 s): each survivor's wait_signal
    fails naming rank 1 as dead well before its timeout, the group is failed for later collectives, and once the
    survivors have exited no name of the job is left in /dev/shm."""
    before = shm_entries()
    results = launch(world_size, _killed_while_waited_worker, env=ENV, pg_timeout_s=60, timeout_s=180,
                     return_exceptions=True)
    victim = results[VICTIM]
    assert isinstance(victim, RankFailure) and victim.exitcode == -signal.SIGKILL, f"rank 1: {victim}"
    for rank, res in enumerate(results):
        if rank == VICTIM:
            continue
        assert not isinstance(res, RankFailure), str(res)
        assert res["error"] is not None, f"rank {rank}: wait_signal returned after its peer was killed"
        assert "rank 1 (pid" in res["error"] and "is dead" in res["error"], res["error"]
        assert res["seconds"] * 1000 < WAIT_TIMEOUT_MS, res
        assert res["after"] is not None and "rank 1" in res["after"], res["after"]
    assert_no_new_shm(before)


# ---------------------------------------------------------------------------------------------------------------
# Refusals


def _gloo_worker(rank: int, world_size: int) -> dict:
    out = {"supports_window": dist.distributed_c10d._supports_window()}
    try:
        symm_mem.empty(16, device="cpu")
        out["empty"] = None
    except RuntimeError as exc:
        out["empty"] = str(exc)
    return out


@needs_windows
def test_gloo_group_is_refused():
    """On a gloo default group, symm_mem.empty on CPU names the group's backend and what to use instead."""
    for res in launch(2, _gloo_worker, backend="gloo"):
        assert res["supports_window"] is False
        assert res["empty"] is not None and "'gloo', not 'tuned'" in res["empty"], res["empty"]


def _outside_heap_worker(rank: int, world_size: int) -> dict:
    try:
        dist.distributed_c10d._new_window(torch.zeros(64))
        out = {"error": None}
    except RuntimeError as exc:
        out = {"error": str(exc)}
    meet_on_store("refused", rank, world_size)  # the group is failed now
    return out


@needs_windows
def test_window_outside_the_heap_is_refused():
    """A window over an ordinary tensor is refused on every rank, naming the op, the rank and the fix."""
    before = shm_entries()
    for rank, res in enumerate(launch(2, _outside_heap_worker)):
        assert res["error"] is not None, f"rank {rank}: new_window over an ordinary tensor succeeded"
        assert f"Window.tensor_register: rank {rank} of 2" in res["error"], res["error"]
        assert "is not in this rank's symmetric heap" in res["error"], res["error"]
    assert_no_new_shm(before)


def _two_hosts_worker(rank: int, world_size: int) -> dict:
    # Two hosts simulated with TUNEDIST_HOST_ID, as in test_multihost.py.
    os.environ["TUNEDIST_HOST_ID"] = f"host{rank}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world_size)
    out = {"supports_window": dist.distributed_c10d._supports_window()}
    t = symm_mem.empty(64, device="cpu")
    for key, call in (("window", lambda: dist.distributed_c10d._new_window(t)),
                      ("rendezvous", lambda: symm_mem.rendezvous(t, dist.group.WORLD))):
        try:
            call()
            out[key] = None
        except RuntimeError as exc:
            out[key] = str(exc)
    meet_on_store("hosts_done", rank, world_size)  # the refusals may have failed the group
    return out


@needs_windows
def test_several_hosts_are_refused():
    """A group over two (simulated) hosts offers no window, and refuses new_window and rendezvous, saying why."""
    for res in launch(2, _two_hosts_worker, init=False):
        assert res["supports_window"] is False
        assert res["window"] is not None and "spans 2 hosts" in res["window"], res["window"]
        assert res["rendezvous"] is not None and "spans several hosts" in res["rendezvous"], res["rendezvous"]


def _example_worker(rank: int, world_size: int) -> None:
    import runpy

    example = Path(__file__).resolve().parents[2] / "examples" / "symm_mem_allgather.py"
    runpy.run_path(str(example), run_name="__main__")  # asserts its results itself


@pytest.mark.parametrize("world_size", [pytest.param(n, id=f"w{n}") for n in (2, 3)])
def test_example_allgather_and_halo(world_size):
    """examples/symm_mem_allgather.py (the docs' example) runs and checks its own results."""
    before = shm_entries()
    launch(world_size, _example_worker, init=False)
    assert_no_new_shm(before)
