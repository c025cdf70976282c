"""Reconfigure on the ``tuned`` backend (torch's _get_reconfigure_handle / _reconfigure), in real processes.

* A group made with enable_reconfigure=True refuses every operation, naming op and rank, until reconfigured.
* A list of handles gives the new ranks by position, a set orders them by stable rank; the group's collectives,
  send/recv and symmetric buffers then work and agree bit for bit, with closed-form values.
* A uuid is used once: the same process refuses it locally, and a process that never saw it is refused by the
  claim of the membership that used it.
* After a SIGKILL the survivors re-form the group without the dead rank, and a replacement process started later
  joins them: the group is back to full size, on one host and across simulated hosts.
* Abort hooks run when a send or a receive fails because its peer died.
* examples/train_ddp_shrink.py with a standby replacement (the cold one is in test_abort_shrink.py).
* A send or receive whose peer dies before it exchanged any message with this rank fails as a dead peer, naming
  the op and both ranks, not at its timeout.
Every test leaves nothing in /dev/shm. All groups use a TCP store hosted by the test process, so any rank may die.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import RankFailure, assert_no_new_shm, expect_error, launch, shm_entries
from test_abort_shrink import _check_group, _same_everywhere

# Reconfigure is c10d's from torch 2.14 on (C10D_BACKEND_HAS_RECONFIGURE); an older torch has no such call to test.
pytestmark = pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_reconfigure"),
                                reason="this torch's c10d has no _reconfigure (torch >= 2.14)")

GROUP_TIMEOUT_S = 300.0
c10d = dist.distributed_c10d


def _store_server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=GROUP_TIMEOUT_S))


def _join(port: int, rank: int, world_size: int, reconfigurable: bool = True) -> dist.TCPStore:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.init_process_group("tuned", store=dist.PrefixStore("job/", store), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S), enable_reconfigure=reconfigurable)
    return store


def _exchange(store, tag: str, key: int, count: int) -> list[str]:
    """Every member publishes its handle under `key`; returns the `count` handles by key (the out-of-band step)."""
    store.set(f"{tag}/{key}", c10d._get_reconfigure_handle())
    return [store.get(f"{tag}/{k}").decode() for k in range(count)]


def _identity() -> torch.Tensor:
    """Every rank's launch rank, gathered in the group's rank order."""
    me = torch.tensor([int(os.environ["RANK"])])
    out = [torch.empty_like(me) for _ in range(dist.get_world_size())]
    dist.all_gather(out, me)
    return torch.cat(out)


# ---- before reconfigure, a list, a set ----


def _list_and_set(rank: int, world_size: int, port: int) -> dict:
    store = _join(port, rank, world_size)
    pg = dist.group.WORLD
    refused = {
        "all_reduce": expect_error(dist.all_reduce, torch.ones(4), expected=RuntimeError)[0],
        "send": expect_error(dist.send, torch.ones(4), (rank + 1) % world_size, expected=RuntimeError)[0],
        "barrier": expect_error(dist.barrier, expected=RuntimeError)[0],
        "monitored_barrier": expect_error(dist.monitored_barrier, expected=RuntimeError)[0],
    }
    handles = _exchange(store, "first", rank, world_size)
    missing = expect_error(c10d._reconfigure, 1, [h for i, h in enumerate(handles) if i != rank],
                           expected=RuntimeError)[0]
    # A list: ranks by position, here reversed.
    c10d._reconfigure(1, list(reversed(handles))).wait()
    out = {"refused": refused, "missing": missing, "supports": c10d._supports_reconfigure(),
           "handle": handles[rank], "reversed_rank": dist.get_rank(), "reversed_size": dist.get_world_size(),
           "reversed_ids": _identity()}
    t = torch.full((5,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    out["reversed_sum"] = t
    out["reversed_group"] = _check_group("reversed")
    # A set: the backend orders it by stable rank (the rank each process joined with), so this is launch order.
    handles = _exchange(store, "second", rank, world_size)
    twice = handles + [handles[rank].replace(":1:", ":9:", 1)] if rank == 0 else handles
    if rank == 0:
        out["twice"] = expect_error(c10d._reconfigure, 2, twice, expected=RuntimeError)[0]
    c10d._reconfigure(2, set(handles)).wait()
    out["set_rank"], out["set_ids"] = dist.get_rank(), _identity()
    out["set_group"] = _check_group("set")
    assert pg is dist.group.WORLD
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_reconfigure_list_and_set(world_size):
    before = shm_entries()
    server = _store_server()
    res = launch(world_size, _list_and_set, server.port, init=False, pg_timeout_s=GROUP_TIMEOUT_S)
    tri = world_size * (world_size + 1) / 2
    for rank, r in enumerate(res):
        for op, msg in r["refused"].items():
            assert f"tunedist: {op}: rank {rank} of {world_size}: this group was created with enable_reconfigure" \
                   in msg, (op, msg)
        assert "is not among the" in r["missing"], r["missing"]
        assert r["supports"] is True
        assert r["handle"].startswith(f"tuned:{rank}:-1:{rank}:"), r["handle"]
        assert (r["reversed_rank"], r["reversed_size"]) == (world_size - 1 - rank, world_size)
        assert r["reversed_ids"].tolist() == list(reversed(range(world_size)))
        assert r["reversed_sum"].tolist() == [tri] * 5
        assert r["set_rank"] == rank and r["set_ids"].tolist() == list(range(world_size))
    assert "two handles name the same process" in res[0]["twice"], res[0]["twice"]
    _same_everywhere([r["reversed_group"] for r in res])
    _same_everywhere([r["set_group"] for r in res])
    assert_no_new_shm(before)


# ---- a uuid is used once ----


def _uuid_once(rank: int, world_size: int, port: int) -> dict:
    store = _join(port, rank, world_size)
    out = {}
    if rank < 2:
        # Ranks 0 and 1 form a group of two under uuid 7.
        handles = _exchange(store, "pair", rank, 2)
        c10d._reconfigure(7, handles).wait()
        t = torch.ones(3)
        dist.all_reduce(t)
        out["pair_sum"] = t.clone()
        # The same process again: refused before anything is written.
        handles = _exchange(store, "again", rank, 2)
        out["local"] = expect_error(c10d._reconfigure, 7, handles, expected=RuntimeError)[0]
        store.set(f"pair_done/{rank}", "1")
        dist.all_reduce(t)  # the group of two still works
        out["pair_sum_after"] = t
        store.wait(["alone_done"])
    else:
        # A process that never took part: uuid 7 is claimed by the pair's rank 0.
        store.wait(["pair_done/0", "pair_done/1"])
        alone = [c10d._get_reconfigure_handle()]
        out["claimed"] = expect_error(c10d._reconfigure, 7, alone, expected=RuntimeError)[0]
        c10d._reconfigure(8, alone).wait()
        t = torch.full((2,), 5.0)
        dist.all_reduce(t)
        out["alone"] = (dist.get_rank(), dist.get_world_size(), t)
        store.set("alone_done", "1")
    return out


def test_old_uuid_rejected():
    before = shm_entries()
    server = _store_server()
    res = launch(3, _uuid_once, server.port, init=False, pg_timeout_s=GROUP_TIMEOUT_S)
    for r in res[:2]:
        assert r["pair_sum"].tolist() == [2.0] * 3 and r["pair_sum_after"].tolist() == [4.0] * 3, r
        assert "uuid 7 was used by this group already" in r["local"], r["local"]
    assert "uuid 7 was used already (claimed by tuned:0:-1:0:" in res[2]["claimed"], res[2]["claimed"]
    rank, size, t = res[2]["alone"]
    assert (rank, size, t.tolist()) == (0, 1, [5.0, 5.0])
    assert_no_new_shm(before)


# ---- a replacement joins the survivors of a SIGKILL ----


def _replacement(rank: int, world_size: int, port: int, size: int, victim: int, hosts: list | None) -> dict:
    """Launch ranks 0..size-1 are the job; launch rank `size` is the replacement for `victim`."""
    import multihost_checks as mc

    replacement = rank == size
    me = victim if replacement else rank
    if hosts is not None:
        os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[me]}"
    if replacement:
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S)).wait(
            ["shrunk/done"])
        started = time.monotonic()
    store = _join(port, me, size)
    if replacement:
        store.set("full/replacement", c10d._get_reconfigure_handle())
        handles = {store.get(f"full/{k}").decode() for k in [*range(size - 1), "replacement"]}
        c10d._reconfigure(3, handles).wait()
        joined = time.monotonic() - started
    else:
        handles = _exchange(store, "start", me, size)
        c10d._reconfigure(1, handles).wait()
        before = _check_group("before")
        if me == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        message = expect_error(dist.all_reduce, torch.ones(1024))[0]
        # The survivors: a set of their handles, ordered by stable rank.
        key = me - (me > victim)
        store.set(f"shrunk/{key}", c10d._get_reconfigure_handle())
        c10d._reconfigure(2, {store.get(f"shrunk/{k}").decode() for k in range(size - 1)}).wait()
        shrunk = _check_group("shrunk")
        shrunk_hosts = mc.run_all(dist.get_rank(), dist.get_world_size())["hosts"] if hosts else None
        if store.add("shrunk/count", 1) == size - 1:
            store.set("shrunk/done", "1")
        # Back to full size: the survivors' current handles and the replacement's, as a set.
        store.set(f"full/{dist.get_rank()}", c10d._get_reconfigure_handle())
        handles = {store.get(f"full/{k}").decode() for k in [*range(size - 1), "replacement"]}
        c10d._reconfigure(3, handles).wait()
    full = _check_group("full")
    full["joined_s"] = joined if replacement else None
    full["full_hosts"] = mc.run_all(dist.get_rank(), dist.get_world_size())["hosts"] if hosts else None
    if not replacement:
        full.update(shrunk_rank=shrunk["rank"], shrunk_size=shrunk["size"], shrunk_group=shrunk, message=message,
                    shrunk_hosts=shrunk_hosts, before_sum=before["sum"])
    full["ids"] = _identity()
    full["replacement"] = replacement
    return full


def _run_replacement(size: int, victim: int, hosts: list | None = None) -> list:
    before = shm_entries()
    server = _store_server()
    res = launch(size + 1, _replacement, server.port, size, victim, hosts, init=False, return_exceptions=True,
                 pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[victim], RankFailure) and res[victim].exitcode == -signal.SIGKILL, res[victim]
    survivors = [r for i, r in enumerate(res[:size]) if i != victim]
    for new_rank, r in enumerate(survivors):
        assert not isinstance(r, RankFailure), r
        assert (r["shrunk_rank"], r["shrunk_size"]) == (new_rank, size - 1), r
        assert f"rank {victim}" in r["message"] or "dead" in r["message"], r["message"]
        if hosts is None:
            # On one host the dead rank is found in shared memory, and the error says how to keep going.
            assert f"dist.shrink_group([{victim}])" in r["message"] and "reconfigure" in r["message"], r["message"]
    _same_everywhere([r["shrunk_group"] for r in survivors])
    full = [res[i] for i in range(size + 1) if i != victim]
    assert not isinstance(res[size], RankFailure), res[size]
    # The replacement takes the dead rank's place (a set is ordered by stable rank): launch order again.
    for r in full:
        assert r["size"] == size and r["ids"].tolist() == [*range(victim), size, *range(victim + 1, size)], r["ids"]
    assert res[size]["rank"] == victim
    _same_everywhere(full)
    # The full group sums what it summed before the kill (same inputs, seeded by rank).
    assert torch.equal(full[0]["sum"], survivors[0]["before_sum"])
    assert_no_new_shm(before)
    return res


@pytest.mark.parametrize("size,victim", [(2, 1), (3, 0), (3, 2)])
def test_replacement_joins_after_sigkill(size, victim):
    _run_replacement(size, victim)


def test_replacement_joins_across_hosts():
    # Host 1 (rank 2) is lost whole: the survivors run on one host, the replacement brings host 1 back.
    hosts = [0, 0, 1]
    res = _run_replacement(3, 2, hosts)
    assert res[0]["shrunk_hosts"] == [[0, 1]], res[0]["shrunk_hosts"]
    for r in (res[0], res[1], res[3]):
        assert r["full_hosts"] == [[0, 1], [2]], r["full_hosts"]


# ---- abort hooks on send/recv ----


def _p2p_hooks(rank: int, world_size: int, port: int) -> dict:
    store = _join(port, rank, world_size, reconfigurable=False)
    ran: list[str] = []
    dist.group.WORLD.register_abort_hook(1, lambda: ran.append("hook"))
    # One message each way first: the rings 1 -> 0 and 2 -> 1 exist, with both ends attached, so the peer is watched
    # through them (test_p2p_peer_dead_before_any_message covers peers that never exchanged a message).
    if rank == 1:
        dist.send(torch.ones(4), 0)
        dist.recv(torch.empty(4), 2)
    elif rank == 0:
        dist.recv(torch.empty(4), 1)
    else:
        dist.send(torch.ones(4), 1)
    dist.barrier()
    work = _post_to_rank_1_and_kill_it(rank, store)
    message = expect_error(work.wait, expected=RuntimeError)[0]
    return {"ran": list(ran), "message": message}


def _post_to_rank_1_and_kill_it(rank: int, store):
    """Rank 0 posts a receive from rank 1 and rank 2 a send to it of more than a ring holds; once both are posted,
    rank 1 is SIGKILLed. Returns the posted operation's Work on ranks 0 and 2."""
    if rank == 1:
        store.wait(["posted/0", "posted/2"])
        time.sleep(0.2)  # both peers are inside their operation with this rank
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        work = dist.irecv(torch.empty(1024), 1)
    else:
        work = dist.isend(torch.ones(16 << 20), 1)
    store.set(f"posted/{rank}", "1")
    return work


def test_abort_hooks_run_when_a_p2p_peer_dies():
    before = shm_entries()
    server = _store_server()
    res = launch(3, _p2p_hooks, server.port, init=False, return_exceptions=True, pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[1], RankFailure) and res[1].exitcode == -signal.SIGKILL, res[1]
    for r in (res[0], res[2]):
        assert "rank 1" in r["message"], r["message"]
        assert r["ran"] == ["hook"], r
    assert_no_new_shm(before)


def _p2p_dead_before_any_message(rank: int, world_size: int, port: int) -> dict:
    store = _join(port, rank, world_size, reconfigurable=False)
    dist.barrier()  # every rank's engines exist; no rank has sent anything to another
    # Rank 0 waits for a message rank 1 never sends; rank 2 sends it more than a ring holds, which it never maps.
    work = _post_to_rank_1_and_kill_it(rank, store)
    start = time.monotonic()
    message = expect_error(work.wait, expected=RuntimeError)[0]
    return {"message": message, "after_s": time.monotonic() - start}


def test_p2p_peer_dead_before_any_message():
    """Rank 1 is SIGKILLed before its first send to rank 0 and before it maps the ring of rank 2's send to it: both
    fail with its death (found through the identity its engine published), naming the op and the ranks, where they
    used to wait for the group's timeout (300 s here)."""
    before = shm_entries()
    server = _store_server()
    res = launch(3, _p2p_dead_before_any_message, server.port, init=False, return_exceptions=True,
                 pg_timeout_s=GROUP_TIMEOUT_S)
    assert isinstance(res[1], RankFailure) and res[1].exitcode == -signal.SIGKILL, res[1]
    recv, send = res[0]["message"], res[2]["message"]
    assert "recv from rank 1" in recv and "on rank 0" in recv, recv
    assert "rank 1 is dead" in recv and "before it sent anything to this rank" in recv, recv
    assert "send to rank 1" in send and "on rank 2" in send, send
    assert "rank 1 is dead" in send and "before it received anything from this rank" in send, send
    for m in (recv, send):
        assert "Timed out" not in m, m
    assert_no_new_shm(before)


def test_recovery_example_standby_replacement(tmp_path):
    """examples/train_ddp_shrink.py --standby: the replacement is started with the job (imported, model and optimizer
    built) and called in once the survivors have shrunk; it receives their parameters and optimizer state, and all
    three finish with each other's parameters bit for bit (checked inside) in launch order."""
    repo = Path(__file__).resolve().parents[2]
    before = shm_entries()
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(repo / "examples" / "train_ddp_shrink.py"), "--world-size", "3",
                           "--kill-step", "3", "--steps", "6", "--standby", "--no-reference", "--json", str(out)],
                          cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    run = json.loads(out.read_text())["shrink"]
    assert run["replacement_mode"] == "standby", run
    assert run["survivors"] == [[0, 0, 2], [2, 1, 2]], run
    assert run["final"] == [[0, 0, 3], [2, 2, 3], [1, 1, 3]], run
    assert set(run["replacement_stages_s"]) >= {"call", "reconfigure", "receive_state", "first_full_step"}, run
    assert_no_new_shm(before)
