"""Symmetric CPU buffers in real processes: ``tunedist.symmetric_empty``/``is_symmetric``/
``symmetric_heap_stats``, the zero-copy all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast,
and FSDP2 staging its collectives in the heap (``set_allocate_memory_from_process_group_for_comm``).

As in test_collectives.py, one launch per world size (2, 3, 4) runs the in-rank checks (symmetric_checks.py:
collectives, ranks that disagree; symmetric_checks_views.py: views, reuse after wait(); symmetric_checks_heap.py:
free and reuse, several groups, the heap's files, bounds and settings, FSDP2), and each pytest test reports one
section of that run. The launches set TUNEDIST_SYMMETRIC_MIN_BYTES=0 so that small buffers run zero-copy too;
every call on symmetric buffers is checked to have taken the path it should through the heap's counters, and its
result against values computed from every rank's deterministic inputs and against the copying path, bit for bit.
After each launch: every file the job mapped was private, and none is left in /dev/shm.

Separately: a rank SIGKILLed after allocating, before any collective or before its second one.
No test asserts speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

import symmetric_checks as collectives
import symmetric_checks_heap as heap
import symmetric_checks_views as views
from collective_checks import Checker, section_problems
from dist_utils import SHM_DIR, RankFailure, assert_no_new_shm, expect_error, launch, shm_entries

ENV = {"TUNEDIST_SYMMETRIC_MIN_BYTES": "0"}
LAUNCH_TIMEOUT_S = 300.0

SECTIONS = {
    "all_reduce": collectives.check_all_reduce,
    "all_gather_into_tensor": collectives.check_all_gather_into_tensor,
    "reduce_scatter_tensor": collectives.check_reduce_scatter_tensor,
    "broadcast": collectives.check_broadcast,
    "mixed": collectives.check_mixed,
    "views": views.check_views,
    "reuse_after_wait": views.check_reuse_after_wait,
    "groups": heap.check_groups,
    "free_reuse": heap.check_free_reuse,
    "heap_files": heap.check_heap_files,
    "fsdp2": heap.check_fsdp2,
    "bounds": heap.check_bounds,  # last: it makes groups fail on purpose
}
# World size 3 runs the sections whose logic depends on the world size (slices, roots, sub-groups); the heap's own
# behaviour and FSDP2 run at world size 2.
ONLY_AT = {"views": (2, 4), "reuse_after_wait": (2, 4), "free_reuse": (2,), "heap_files": (2, 4), "fsdp2": (2,),
           "bounds": (2,)}
WORLD_SIZES = [pytest.param(n, id=f"w{n}") for n in (2, 3, 4)]


def _runs_at(section: str, world_size: int) -> bool:
    return world_size in ONLY_AT.get(section, (world_size,))


def _run_sections(rank: int, world_size: int) -> dict:
    c = Checker(rank, world_size)
    for name, fn in SECTIONS.items():
        if _runs_at(name, world_size):
            c.run(name, fn)
    collectives.mapped_shm()
    return {"failures": dict(c.failures), "digests": dict(c.digests), "ran": c.ran, "seconds": c.seconds,
            "shm": sorted(collectives.SEEN_SHM), "not_private": collectives.NOT_PRIVATE}


@pytest.fixture(scope="module", params=WORLD_SIZES)
def matrix(request):
    world_size = request.param
    before = shm_entries()
    try:
        results = launch(world_size, _run_sections, env=ENV, timeout_s=LAUNCH_TIMEOUT_S)
        print(f"\nworld size {world_size}, seconds per section on rank 0: "
              + ", ".join(f"{k} {v:.1f}" for k, v in results[0]["seconds"].items()))
        return world_size, results, None, before
    except AssertionError as exc:
        return world_size, None, exc, before


@pytest.mark.parametrize("section", list(SECTIONS))
def test_symmetric(matrix, section):
    world_size, results, error, _ = matrix
    if not _runs_at(section, world_size):
        pytest.skip(f"{section} runs at world sizes {ONLY_AT[section]}")
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    problems = section_problems(section, world_size, results)
    if problems:
        pytest.fail(f"{section} with world size {world_size}:\n" + "\n".join(problems), pytrace=False)


def test_job_files_are_private(matrix):
    """Every file the ranks mapped (heap chunks, group segments), checked when a rank first saw it mapped, most
    right after the allocation that created it: mode 0600, owned by us, our uid in its name."""
    world_size, results, error, _ = matrix
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    problems = [f"rank {rank}: {p}" for rank, res in enumerate(results) for p in res["not_private"]]
    assert not problems, "\n".join(problems)


def test_job_leaves_no_shm(matrix):
    """Nothing the job mapped (heap chunks, group segments) is left in /dev/shm once its ranks have exited."""
    world_size, results, error, before = matrix
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    job = {name for res in results for name in res["shm"]}
    assert any(heap.ANY_HEAP_NAME.fullmatch(n) for n in job), f"the job mapped no heap chunk: {sorted(job)}"
    left = sorted(n for n in job if (SHM_DIR / n).exists())
    assert not left, f"left in /dev/shm by the world-size-{world_size} job: {left}"
    assert_no_new_shm(before)


# ---------------------------------------------------------------------------------------------------------------
# A rank killed after allocating

VICTIM = 1
KILL_GROUP_TIMEOUT_S = 10.0  # bounds the survivor's wait, whether or not it detects the death sooner
# id: run an ordinary all_reduce (the group's segment attached, no zero-copy operation yet) before allocating?
KILL_CASES = {"before_any_collective": False, "after_a_collective": True}


def _wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Until `pid` is dead (gone, or a zombie its parent has not reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} still alive {timeout_s:.0f} s after SIGKILL")


def _killed_after_alloc_worker(rank: int, world_size: int, warm_up: bool) -> dict:
    store = dist.distributed_c10d._get_default_store()
    if warm_up:
        dist.all_reduce(torch.ones(4))
    before = collectives.mapped_shm()
    t = collectives.sym(300_000)
    own = sorted(collectives.mapped_shm() - before)
    modes = {name: oct(os.stat(SHM_DIR / name).st_mode & 0o777) for name in own}
    store.set(f"heap_{rank}", json.dumps({"pid": os.getpid(), "own": own}))
    store.wait([f"heap_{r}" for r in range(world_size)])
    if rank == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    victim = json.loads(store.get(f"heap_{VICTIM}"))
    _wait_gone(victim["pid"])
    t.fill_(1.0)
    message, _ = expect_error(dist.all_reduce, t)
    return {"message": message, "own": own, "modes": modes, "victim_own": victim["own"]}


@pytest.mark.parametrize("case", list(KILL_CASES))
def test_rank_killed_after_allocating(case):
    """Rank 1 allocates symmetric memory and is SIGKILLed before the group's next collective (its first one, or
    the first after an ordinary all_reduce): the survivor's next collective fails naming rank 1 (within the group's
    short timeout at the latest), and once the survivor has exited no file of the job is left in /dev/shm, the dead
    rank's heap chunk included."""
    before = shm_entries()
    results = launch(2, _killed_after_alloc_worker, KILL_CASES[case], env=ENV, pg_timeout_s=KILL_GROUP_TIMEOUT_S,
                     timeout_s=120, return_exceptions=True)
    victim, survivor = results[VICTIM], results[0]
    assert isinstance(victim, RankFailure) and victim.exitcode == -signal.SIGKILL, f"rank 1: {victim}"
    assert not isinstance(survivor, RankFailure), str(survivor)
    assert re.search(r"ranks \[1\]|\brank 1\b", survivor["message"]), survivor["message"]
    assert survivor["own"] and survivor["victim_own"], survivor
    assert all(mode == "0o600" for mode in survivor["modes"].values()), survivor["modes"]
    job = set(survivor["own"]) | set(survivor["victim_own"])
    left = sorted(n for n in job if (SHM_DIR / n).exists())
    for name in left:  # ours: do not leave them to other tests
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not left, (f"left in /dev/shm after the survivor exited: {left} (rank 0's chunks "
                      f"{survivor['own']}, the killed rank 1's {survivor['victim_own']})")
    assert_no_new_shm(before)
