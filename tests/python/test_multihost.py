"""The `tuned` backend on groups that span several hosts.

Hosts are simulated on this machine with TUNEDIST_HOST_ID (ranks that share memory, split into hosts), by two
torchruns (--nnodes=2) and by network namespaces joined by veth pairs, where gloo crosses a real interface.
Every collective is checked against closed-form values (multihost_checks.py), for 2x2, uneven 2+1 and 1+1+1
layouts and a sub-group that spans some hosts only; DDP over 2x2 must reach gloo's parameters; the hierarchical
all_reduce must hand gloo about N/L bytes per rank; killing a host mid-collective must fail the other host with a
clear error well before the timeout, leaving nothing in /dev/shm (conftest checks that after every test).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import multihost_checks as mc
from dist_utils import launch


def _init(rank: int, world: int, hosts: list, timeout_s: float = 60.0) -> None:
    """Joins the default group as a rank of host hosts[rank] (its TUNEDIST_HOST_ID)."""
    os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[rank]}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _all_ops(rank: int, world: int, hosts: list) -> dict:
    _init(rank, world, hosts)
    return mc.run_all(rank, world)


@pytest.mark.parametrize("hosts", [
    pytest.param([0, 0, 1, 1], id="2x2"),
    pytest.param([0, 1, 0], id="uneven-2+1-interleaved"),
    pytest.param([0, 1, 2], id="1+1+1"),
])
def test_every_op_across_hosts(hosts):
    results = launch(len(hosts), _all_ops, hosts, init=False)
    want = [[r for r in range(len(hosts)) if hosts[r] == h] for h in sorted(set(hosts), key=hosts.index)]
    for res in results:
        assert res["hosts"] == want


def _sub_group(rank: int, world: int, hosts: list) -> dict:
    _init(rank, world, hosts)
    members = [0, 1, 2]  # host 0 whole, one rank of host 1
    sub = dist.new_group(members, backend="tuned")
    out = {}
    if rank in members:
        out = mc.run_all(members.index(rank), len(members), sub)
    dist.barrier()
    return out


def test_sub_group_spanning_some_hosts():
    results = launch(4, _sub_group, [0, 0, 1, 1], init=False)
    for rank in (0, 1, 2):
        assert results[rank]["hosts"] == [[0, 1], [2]]


def _one_host_group(rank: int, world: int) -> dict:
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world)
    t = torch.ones(1000)
    dist.all_reduce(t)
    stats = mc.tunedist._C.cross_host_stats(mc.tuned_backend())
    return {"hosts": mc.host_layout(), "stats": stats, "value": t[0].item()}


def test_one_host_stays_on_shared_memory():
    for res in launch(2, _one_host_group, init=False):
        assert res["hosts"] == [[0, 1]]
        assert res["stats"]["gloo_ops"] == 0 and res["stats"]["data_bytes"] == 0
        assert res["value"] == 2.0


def _gloo_bytes(rank: int, world: int, hosts: list, n: int) -> int:
    _init(rank, world, hosts)
    return mc.gloo_bytes_of_all_reduce(n)


@pytest.mark.parametrize("hosts,per_rank_share", [
    pytest.param([0, 0, 1, 1], [0.5, 0.5, 0.5, 0.5], id="2x2"),
    pytest.param([0, 0, 1], [0.5, 0.5, 1.0], id="2+1"),
])
def test_gloo_carries_a_slice_per_rank(hosts, per_rank_share):
    n = 1 << 20  # float32: 4 MiB
    got = launch(len(hosts), _gloo_bytes, hosts, n, init=False)
    for rank, share in enumerate(per_rank_share):
        assert got[rank] == int(4 * n * share), f"rank {rank} handed gloo {got[rank]} bytes; expected {share} x 4 MiB"


def _disagree(rank: int, world: int, hosts: list) -> str:
    _init(rank, world, hosts)
    n = 10 if hosts[rank] == 0 else 12  # the hosts disagree; inside each host the ranks agree
    try:
        dist.all_reduce(torch.ones(n))
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_metadata_disagreement_across_hosts_is_a_clear_error():
    for rank, msg in enumerate(launch(4, _disagree, [0, 0, 1, 1], init=False)):
        assert "all_reduce" in msg and "disagree" in msg and "element count" in msg, f"rank {rank}: {msg}"


def _ddp(rank: int, world: int, hosts: list) -> float:
    _init(rank, world, hosts)
    return mc.ddp_matches_gloo(rank, world)


def test_ddp_2x2_matches_gloo():
    for diff in launch(4, _ddp, [0, 0, 1, 1], init=False):
        assert diff < 1e-6


def _die_mid_collective(rank: int, world: int, hosts: list, timeout_s: float) -> dict:
    _init(rank, world, hosts, timeout_s=timeout_s)
    t = torch.ones(1 << 20)
    dist.all_reduce(t)  # everything set up, gloo groups included
    if hosts[rank] == 1:
        # The whole host dies while collectives are in flight.
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        for _ in range(100_000):
            dist.all_reduce(t)
    except RuntimeError as e:
        return {"error": str(e), "after_s": time.monotonic() - start}
    return {"error": None, "after_s": time.monotonic() - start}


def test_dead_host_fails_the_other_host_quickly():
    timeout_s = 120.0
    results = launch(4, _die_mid_collective, [0, 0, 1, 1], timeout_s, init=False, return_exceptions=True)
    for rank in (2, 3):
        assert isinstance(results[rank], mc.__class__) or getattr(results[rank], "exitcode", None) == -signal.SIGKILL
    for rank in (0, 1):
        res = results[rank]
        assert isinstance(res, dict) and res["error"], f"rank {rank}: {res}"
        assert "all_reduce" in res["error"] and "seq" in res["error"], res["error"]
        assert "dead" in res["error"] or "closed" in res["error"], res["error"]
        # Detected through the dead connections, not by running into the group timeout.
        assert res["after_s"] < timeout_s / 2, res
