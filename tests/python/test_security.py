"""Shared-memory hygiene of the ``tuned`` backend: who can open a group's segment, how long its name exists, that
jobs do not interfere, that a crash leaves nothing that outlives the next job's start-up, and that a /dev/shm too
small for a group fails with an actionable error instead of a SIGBUS.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

from dist_utils import SHM_DIR, RankFailure, launch
from fault_workers import read_results, run_torchrun

LAUNCH_TIMEOUT_S = 120.0
# The backend's own key (csrc/shm/comm.cpp kSegmentKey) under which rank 0 announces the segment's name.
SEGMENT_KEY = "tunedist_shm_segment"
# ShmSegment::create sweeps only names at least ShmOptions::sweepMinAge old (30 s by default; csrc/shm/segment.cpp,
# whose Catch2 test checks that a younger name is spared). The next job here sets it lower, so that it waits 3 s
# for the stale name instead of 31.
SWEEP_MIN_AGE_S = 2


def _segment_name_from_store(timeout_s: float = 60.0) -> str:
    """The name rank 0 announced for the default group's segment, read from the store the backend was given: c10d
    hands a backend PrefixStore("<device>/", ...) over the default store, with a "<group name>/" level in between
    for some groups (torch 2.15 leaves it out for the default group); both layouts are tried."""
    default = dist.distributed_c10d._get_default_store()
    candidates = [dist.PrefixStore("cpu/", default),
                  dist.PrefixStore("cpu/", dist.PrefixStore(f"{dist.group.WORLD.group_name}/", default))]
    deadline = time.monotonic() + timeout_s
    while True:
        for store in candidates:
            if store.check([SEGMENT_KEY]):
                return store.get(SEGMENT_KEY).decode().lstrip("/")
        assert time.monotonic() < deadline, f"rank 0 never announced a segment under '{SEGMENT_KEY}'"
        time.sleep(0.01)


def _inspect_worker(rank: int, world_size: int) -> dict | None:
    if rank == 0:
        os.umask(0)  # the mode must not depend on the umask
        dist.all_reduce(torch.ones(4))  # creates the segment, then waits for rank 1 to attach
        return None
    # Rank 1 has not called a collective yet, so rank 0's segment still has its name.
    name = _segment_name_from_store()
    st = os.stat(SHM_DIR / name)
    x = torch.ones(4)
    dist.all_reduce(x)
    assert x.tolist() == [2.0] * 4
    return {"name": name, "mode": st.st_mode, "uid": st.st_uid, "size": st.st_size,
            "exists_after": (SHM_DIR / name).exists()}


def test_segment_is_private_and_unlinked_once_attached():
    seen = launch(2, _inspect_worker, timeout_s=LAUNCH_TIMEOUT_S)[1]
    uid = os.getuid()
    assert re.fullmatch(rf"tunedist_{uid}_\w+_[0-9a-f]{{32}}", seen["name"]), seen["name"]
    assert stat.S_ISREG(seen["mode"]) and stat.S_IMODE(seen["mode"]) == 0o600, oct(seen["mode"])
    assert seen["uid"] == uid
    assert seen["size"] > 0
    assert not seen["exists_after"], f"{seen['name']} still exists after every rank attached"


def test_two_jobs_at_once(tmp_path):
    """Two 2-rank jobs run their collectives at the same time, each with results only it can produce."""
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda job: run_torchrun("concurrent", tmp_path, str(job), timeout_s=180), (1, 2)))
    for job, (rc, out) in zip((1, 2), runs):
        assert rc == 0, f"job {job} exited with {rc}:\n{out[-6000:]}"
        assert all(r and r["ok"] for r in read_results(tmp_path, f"concurrent{job}")), out[-6000:]


def _orphan_worker(rank: int, world_size: int) -> str | None:
    """Rank 1 kills rank 0 after it created the segment and before anyone else attached: the name stays."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("creator_pid", str(os.getpid()))
        dist.all_reduce(torch.ones(4))
        raise AssertionError("rank 0 completed a collective rank 1 never joined")
    name = _segment_name_from_store()
    os.kill(int(store.get("creator_pid")), signal.SIGKILL)
    try:
        dist.destroy_process_group()  # the store's host is gone; whatever this does, rank 1's result stands
    except Exception:  # noqa: BLE001
        pass
    return name


def _next_job_worker(rank: int, world_size: int, stale: str) -> bool:
    """Rank 0 starts its first collective (which creates a segment and sweeps) once `stale` is old enough to be
    swept; returns whether `stale` still exists afterwards."""
    if rank == 0:
        try:
            age = time.time() - (SHM_DIR / stale).stat().st_ctime
        except FileNotFoundError:  # another job's sweep (tests running concurrently) got there first
            age = float("inf")
        time.sleep(max(0.0, SWEEP_MIN_AGE_S + 1 - age))
    x = torch.ones(4)
    dist.all_reduce(x)
    assert x.tolist() == [2.0] * 4
    return (SHM_DIR / stale).exists()


def test_stale_segment_of_killed_job_is_swept_by_next_job():
    """A creator killed before its peers attached leaves its name; the next job's start-up sweep removes it. The
    sweep spares names younger than TUNEDIST_SWEEP_MIN_AGE_S (they may belong to a job being set up), so the next
    job, which sets it to 2 s, waits for that."""
    results = launch(2, _orphan_worker, timeout_s=LAUNCH_TIMEOUT_S, return_exceptions=True)
    assert isinstance(results[0], RankFailure) and results[0].exitcode == -signal.SIGKILL, str(results[0])
    name = results[1]
    assert isinstance(name, str), str(name)
    assert (SHM_DIR / name).exists(), f"{name}: expected the killed creator to leave its name behind"
    still_there = launch(2, _next_job_worker, name, timeout_s=LAUNCH_TIMEOUT_S,
                         env={"TUNEDIST_SWEEP_MIN_AGE_S": str(SWEEP_MIN_AGE_S)})
    assert still_there == [False, False], f"{name} survived the next job's start-up sweep"


# ---------------------------------------------------------------------------------------------------------------
# /dev/shm too small

WORLD = 2
SMALL_SHM_BYTES = 8 << 20
MAX_SLOT_BYTES = 1 << 30
# Far below the group's 300 s timeout, far above what start-up plus a failing first collective need.
SHM_SMALL_BOUND_S = 90.0


def _slot_bytes_exceeding(free_bytes: int) -> int:
    """A slot size (multiple of 4096) for which WORLD x 2 slots exceed `free_bytes`."""
    return (free_bytes // (2 * WORLD) // 4096 + 1) * 4096


def _can_mount_private_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return probe.returncode == 0


def test_shm_too_small_fails_with_advice(tmp_path):
    """Every rank gets an error naming --shm-size and the bytes needed at its first collective (no SIGBUS, no hang,
    nothing left). Where /dev/shm is large, the job runs in a private mount namespace with an 8 MiB tmpfs there."""
    vfs = os.statvfs(SHM_DIR)
    free = vfs.f_bavail * vfs.f_frsize
    wrapper = None
    if _slot_bytes_exceeding(free) > MAX_SLOT_BYTES:
        if not _can_mount_private_tmpfs():
            pytest.skip(f"/dev/shm has {free >> 20} MiB free, more than the largest slots can claim, and a private "
                        "tmpfs cannot be mounted (needs unshare -m and CAP_SYS_ADMIN)")
        free = SMALL_SHM_BYTES
        script = (f"mount -t tmpfs -o size={SMALL_SHM_BYTES} tmpfs /dev/shm && \"$@\"; rc=$?; "
                  "echo LEFT_IN_SHM: $(ls -A /dev/shm | grep '^tunedist_'); exit $rc")
        wrapper = ["unshare", "-m", "sh", "-c", script, "sh"]
    slot = _slot_bytes_exceeding(free)
    rc, out = run_torchrun("shm_small", tmp_path, wrapper=wrapper, env={"TUNEDIST_SLOT_BYTES": str(slot)},
                           timeout_s=SHM_SMALL_BOUND_S)
    results = read_results(tmp_path, "shm_small")
    if rc is None or None in results:
        reports = {r: res["message"][:500] if res and res["message"] else res for r, res in enumerate(results)}
        pytest.fail(f"the job was still running {SHM_SMALL_BOUND_S:.0f} s into its first collective (killed; the group "
                    f"timeout is 300 s), or a rank died (exit code {rc}). Rank reports: {reports}", pytrace=False)
    for rank, res in enumerate(results):
        msg = res["message"]
        assert msg is not None, f"rank {rank}: the all_reduce succeeded although /dev/shm is too small"
        assert "--shm-size" in msg and str(res["reserved"]) in msg, f"rank {rank}: {msg[:1000]}"
    assert rc == 0, f"the job exited with {rc} (a SIGBUS?):\n{out[-6000:]}"
    if wrapper is not None:
        left = re.search(r"LEFT_IN_SHM:(.*)", out)
        assert left is not None and not left.group(1).strip(), f"left in the private /dev/shm: {left and left.group(1)}"
