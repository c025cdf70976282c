"""Abort, abort hooks and dist.shrink_group on the ``tuned`` backend, in real processes.

* abort() unblocks every waiter of the group at once: a Work being waited on, one queued behind it, a receive, a
  monitored_barrier; each raises the abort (not the group's 300 s timeout), and later calls are refused.
* Abort hooks (ProcessGroup.register_abort_hook) run before an abort and when a collective fails; ids are unique
  and can be removed.
* shrink_group: after a rank is SIGKILLed, or is alive but excluded, the survivors get a `tuned` group of the rest,
  ranks renumbered as torch does, whose collectives, send/recv and symmetric buffers work and agree bit for bit;
  SHRINK_ABORT fails what was in flight first; nothing is left in /dev/shm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tunedist
from dist_utils import RankFailure, assert_no_new_shm, expect_error, launch, shm_entries

GROUP_TIMEOUT_S = 300.0
CPU = torch.device("cpu")
# Abort hooks are c10d's from torch 2.14 on (C10D_BACKEND_HAS_HOOKS); shrink_group is older.
needs_abort_hooks = pytest.mark.skipif(not hasattr(dist.ProcessGroup, "register_abort_hook"),
                                       reason="this torch's ProcessGroup has no register_abort_hook (torch >= 2.14)")


def _poll(store, key: str) -> None:
    while not store.check([key]):
        time.sleep(0.01)


# ---- abort ----


def _abort_unblocks(rank: int, world_size: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    pg = dist.group.WORLD
    dist.all_reduce(torch.ones(8))  # the engines exist: the waits below are inside real operations
    if rank == 1:
        # Takes part in nothing more until rank 0 aborted; rank 0, which hosts the store, leaves after it.
        _poll(store, "aborted")
        store.set("rank1_left", "1")
        return {}
    events: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    assert getattr(pg, "supports_abort_hooks", True)  # torch 2.14 has the hooks but not the query
    pg.register_abort_hook(7, lambda: note("hook"))
    first = dist.all_reduce(torch.ones(1 << 16), async_op=True)  # waits for rank 1, which never comes
    queued = dist.all_reduce(torch.ones(4), async_op=True)  # behind it on the executor
    errors: dict[str, str] = {}

    def waiter(name, fn):
        try:
            fn()
            errors[name] = "returned"
        except Exception as e:  # noqa: BLE001 - the message is the result
            errors[name] = str(e)
        note(name)

    threads = [threading.Thread(target=waiter, args=a) for a in (
        ("work", first.wait),
        ("queued", queued.wait),
        ("recv", lambda: dist.recv(torch.zeros(4), 1)),
        ("monitored_barrier", lambda: dist.monitored_barrier(timeout=timedelta(seconds=GROUP_TIMEOUT_S))),
    )]
    for t in threads:
        t.start()
    time.sleep(1.0)  # let every waiter block (nothing can finish without rank 1; the group timeout is 300 s)
    pg.abort()
    for t in threads:
        t.join()
    store.set("aborted", "1")
    after = expect_error(dist.all_reduce, torch.ones(2), expected=RuntimeError)[0]
    _poll(store, "rank1_left")
    return {"events": events, "errors": errors, "after": after}


@needs_abort_hooks
def test_abort_unblocks_every_waiter():
    before = shm_entries()
    res = launch(2, _abort_unblocks, pg_timeout_s=GROUP_TIMEOUT_S)[0]
    assert res["events"][0] == "hook", res["events"]
    assert res["events"].count("hook") >= 1
    assert sorted(e for e in res["events"] if e != "hook") == ["monitored_barrier", "queued", "recv", "work"]
    for name, msg in res["errors"].items():
        assert "abort" in msg and "Timed out" not in msg, f"{name}: {msg}"
    assert "shut down or aborted" in res["after"], res["after"]
    assert_no_new_shm(before)


def _hooks(rank: int, world_size: int) -> dict:
    pg = dist.group.WORLD
    ran: list[int] = []
    pg.register_abort_hook(1, lambda: ran.append(1))
    pg.register_abort_hook(2, lambda: ran.append(2))
    duplicate = expect_error(pg.register_abort_hook, 1, lambda: None, expected=RuntimeError)[0]
    pg.unregister_abort_hook(2)
    pg.unregister_abort_hook(99)  # not registered: nothing happens
    dist.all_reduce(torch.ones(4))
    assert ran == [], "a hook ran without a failure"
    # A collective that times out runs the hooks before it reports.
    dist.set_timeout(timedelta(seconds=1))
    failure = ""
    if rank == 0:
        failure = expect_error(dist.all_reduce, torch.ones(4), expected=RuntimeError)[0]
    after_failure = list(ran)
    store = dist.distributed_c10d._get_default_store()
    store.set(f"timed_out_{rank}", "1")
    _poll(store, "timed_out_0")
    pg.abort()
    # Rank 0 hosts the store: it leaves after rank 1 is done with it.
    if rank == 1:
        store.set("hooks_left_1", "1")
    else:
        _poll(store, "hooks_left_1")
    return {"duplicate": duplicate, "failure": failure, "after_failure": after_failure, "after_abort": list(ran)}


@needs_abort_hooks
def test_abort_hooks():
    res = launch(2, _hooks)
    assert "with id 1 is registered already" in res[0]["duplicate"], res[0]["duplicate"]
    assert "Timed out" in res[0]["failure"], res[0]["failure"]
    assert res[0]["after_failure"] == [1], res[0]
    assert res[0]["after_abort"] == [1, 1], res[0]
    assert res[1]["after_failure"] == [] and res[1]["after_abort"] == [1], res[1]


# ---- shrink ----


def _check_group(tag: str) -> dict:
    """Collectives, send/recv and a symmetric buffer on the current default group; returns what every rank must
    agree on bit for bit."""
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(4099, generator=g)
    summed = x.clone()
    dist.all_reduce(summed)
    gathered = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(gathered, x)
    # The sum every rank computes alike from the gathered inputs, in rank order.
    reference = gathered[0].clone()
    for t in gathered[1:]:
        reference += t
    b = x.clone() if rank == size - 1 else torch.empty_like(x)
    dist.broadcast(b, size - 1)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(16)
    if size > 1:
        ops = [dist.P2POp(dist.isend, torch.full((16,), float(rank)), nxt),
               dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert got.eq(float(prv)).all(), got
    sym = tunedist.symmetric_empty(1 << 16, group=dist.group.WORLD)
    sym.copy_(torch.arange(1 << 16, dtype=torch.float32) * (rank + 1))
    dist.all_reduce(sym)
    assert tunedist.is_symmetric(sym)
    return {"tag": tag, "rank": rank, "size": size, "sum": summed, "reference_close": torch.allclose(summed, reference),
            "gathered": torch.stack(gathered), "broadcast": b, "sym": sym.clone()}


def _same_everywhere(results: list[dict]) -> None:
    first = results[0]
    for r in results[1:]:
        for key in ("sum", "gathered", "broadcast", "sym"):
            assert torch.equal(r[key].view(torch.int32), first[key].view(torch.int32)), f"{key} differs"
    for r in results:
        assert r["reference_close"], r


def _shrink_after_kill(rank: int, world_size: int, victim: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    before = _check_group("before")
    if rank == victim:
        store.set("victim_pid", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    pid = int(store.get("victim_pid"))
    message = expect_error(dist.all_reduce, torch.ones(1024))[0]
    group = dist.shrink_group([victim])
    assert group is dist.group.WORLD and dist.get_world_size() == world_size - 1
    after = _check_group("after")
    after["old_rank"] = rank
    after["message"] = message
    after["before_sum"] = before["sum"]
    after["victim_pid"] = pid
    after["backend"] = dist.get_backend()
    return after


# Rank 0 hosts the TCP store of a tcp:// group, so it is not a victim here (test_shrink_rank0_with_external_store).
@pytest.mark.parametrize("world_size,victim", [(3, 1), (3, 2), (4, 1)])
def test_shrink_after_sigkill(world_size, victim):
    before = shm_entries()
    res = launch(world_size, _shrink_after_kill, victim, return_exceptions=True, pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[victim], RankFailure) and res[victim].exitcode == -signal.SIGKILL, res[victim]
    survivors = [r for i, r in enumerate(res) if i != victim]
    for new_rank, r in enumerate(survivors):
        assert not isinstance(r, RankFailure), r
        assert r["rank"] == new_rank and r["size"] == world_size - 1, (r["old_rank"], r["rank"], r["size"])
        assert f"rank {victim}" in r["message"] or "died" in r["message"], r["message"]
        assert r["backend"] == "tuned"
    _same_everywhere(survivors)
    assert_no_new_shm(before)


def _shrink_rank0_external(rank: int, world_size: int, port: int) -> dict:
    # The store lives in the launching test process (as torchrun's agent hosts it), so rank 0 may die.
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.init_process_group("tuned", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    _check_group("before")
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    expect_error(dist.all_reduce, torch.ones(1024))
    dist.shrink_group([0])
    after = _check_group("after")
    after["old_rank"] = rank
    return after


def test_shrink_rank0_with_external_store():
    before = shm_entries()
    port_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    res = launch(3, _shrink_rank0_external, port_store.port, init=False, return_exceptions=True,
                 pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[0], RankFailure) and res[0].exitcode == -signal.SIGKILL, res[0]
    assert [(r["old_rank"], r["rank"], r["size"]) for r in res[1:]] == [(1, 0, 2), (2, 1, 2)]
    _same_everywhere(res[1:])
    assert_no_new_shm(before)


def _shrink_abort(rank: int, world_size: int) -> dict:
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        # Alive, but excluded: never joins the all_reduce below.
        _poll(store, "shrunk")
        return {}
    ran = []
    dist.group.WORLD.register_abort_hook(3, lambda: ran.append("hook"))
    pending = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    time.sleep(0.5)  # it is waiting for rank 1 by now (the group timeout is 300 s)
    dist.shrink_group([1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    pending_error = expect_error(pending.wait, expected=RuntimeError)[0]
    store.add("shrunk_count", 1)
    if store.add("shrunk_count", 0) == world_size - 1:
        store.set("shrunk", "1")
    result = _check_group("after")
    result["pending_error"] = pending_error
    result["hook"] = ran
    return result


@needs_abort_hooks
def test_shrink_abort_fails_in_flight_work_first():
    before = shm_entries()
    res = launch(3, _shrink_abort, pg_timeout_s=GROUP_TIMEOUT_S)
    survivors = [res[0], res[2]]
    for r in survivors:
        assert "abort" in r["pending_error"], r["pending_error"]
        assert r["hook"] and r["hook"][0] == "hook", r["hook"]
    assert [(r["rank"], r["size"]) for r in survivors] == [(0, 2), (1, 2)]
    _same_everywhere(survivors)
    assert_no_new_shm(before)


def _shrink_refusals(rank: int, world_size: int) -> dict:
    backend = dist.group.WORLD._get_backend(CPU)
    assert backend.supports_shrinking
    out = {
        "self": expect_error(backend.shrink, [rank], expected=RuntimeError)[0],
        "range": expect_error(backend.shrink, [world_size], expected=RuntimeError)[0],
        "twice": expect_error(backend.shrink, [1, 1], expected=RuntimeError)[0] if rank == 0 else "",
        "flags": expect_error(backend.shrink, [(rank + 1) % world_size], 4, expected=RuntimeError)[0],
    }
    dist.barrier()
    return out


def test_shrink_refusals_name_rank():
    res = launch(2, _shrink_refusals)
    assert "shrink on rank 0: this rank is excluded" in res[0]["self"], res[0]
    assert "rank 2 is not in the group of 2 ranks" in res[1]["range"], res[1]
    assert "excluded twice" in res[0]["twice"], res[0]
    assert "unknown shrink flags 4" in res[0]["flags"], res[0]


def _shrink_across_hosts(rank: int, world_size: int, hosts: list, victim: int) -> dict:
    # Hosts simulated with TUNEDIST_HOST_ID, as in test_multihost.py: gloo carries what crosses them.
    import multihost_checks as mc

    os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[rank]}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    mc.run_all(rank, world_size)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    message = expect_error(dist.all_reduce, torch.ones(1024))[0]
    dist.shrink_group([victim])
    summary = mc.run_all(dist.get_rank(), dist.get_world_size())
    result = _check_group("after")
    result.update(summary)
    result["message"] = message
    return result


@pytest.mark.parametrize("hosts,victim", [
    pytest.param([0, 0, 1, 1], 3, id="2x2-lose-one-of-host-1"),
    pytest.param([0, 0, 1], 2, id="2+1-lose-host-1"),
])
def test_shrink_across_hosts(hosts, victim):
    before = shm_entries()
    res = launch(len(hosts), _shrink_across_hosts, hosts, victim, init=False, return_exceptions=True,
                 pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[victim], RankFailure) and res[victim].exitcode == -signal.SIGKILL, res[victim]
    survivors = [r for i, r in enumerate(res) if i != victim]
    left_hosts = [h for i, h in enumerate(hosts) if i != victim]
    want = [[r for r in range(len(left_hosts)) if left_hosts[r] == h] for h in sorted(set(left_hosts),
                                                                                      key=left_hosts.index)]
    for r in survivors:
        assert not isinstance(r, RankFailure), r
        assert r["hosts"] == want, (r["hosts"], want)
    _same_everywhere(survivors)
    assert_no_new_shm(before)


def test_recovery_example(tmp_path):
    """examples/train_ddp_shrink.py: rank 1 of 3 SIGKILLed mid-training; the survivors shrink and train on, a
    replacement joins them through reconfigure, and all three finish with each other's parameters bit for bit
    (checked inside) and the loss of the run without a failure (to float rounding)."""
    repo = Path(__file__).resolve().parents[2]
    before = shm_entries()
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(repo / "examples" / "train_ddp_shrink.py"), "--world-size", "3",
                           "--kill-step", "3", "--steps", "6", "--json", str(out)], cwd=repo,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    run = json.loads(out.read_text())
    assert run["shrink"]["survivors"] == [[0, 0, 2], [2, 1, 2]], run["shrink"]
    assert run["shrink"]["final"] == [[0, 0, 3], [2, 2, 3], [1, 1, 3]], run["shrink"]
    assert abs(run["shrink"]["final_loss"] - run["reference"]["final_loss"]) < 1e-4, run
    assert_no_new_shm(before)
