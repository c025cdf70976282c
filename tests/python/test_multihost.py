"""The `tuned` backend on groups that span several hosts.

Hosts are simulated on this machine with TUNEDIST_HOST_ID (ranks that share memory, split into hosts), by two
torchruns (--nnodes=2) and by network namespaces joined by veth pairs, where gloo crosses a real interface.
Every collective is checked against closed-form values (multihost_checks.py), for 2x2, uneven 2+1 and 1+1+1
layouts and a sub-group that spans some hosts only; DDP over 2x2 must reach gloo's parameters; the hierarchical
all_reduce must hand gloo about N/L bytes per rank; killing a host mid-collective must fail the other host with a
clear error well before the timeout, leaving nothing in /dev/shm (conftest checks that after every test).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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

import multihost_checks as mc
from dist_utils import RankFailure, free_port, launch, meet_on_store

WORKER = Path(__file__).resolve().parent / "multihost_worker.py"
# Hang guard for the torchrun-based tests (not a performance limit).
TORCHRUN_GUARD_S = 400


def _init(rank: int, world: int, hosts: list, timeout_s: float = 60.0) -> None:
    """Joins the default group as a rank of host hosts[rank] (its TUNEDIST_HOST_ID)."""
    os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[rank]}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _all_ops(rank: int, world: int, hosts: list) -> dict:
    _init(rank, world, hosts)
    if rank == world - 1:
        time.sleep(3.0)  # a slow host: the others wait in gloo and must raise nothing (the timeout is 60 s)
    t = torch.ones(10)
    dist.all_reduce(t)
    assert t[0].item() == world
    return mc.run_all(rank, world)


@pytest.mark.parametrize("hosts", [
    pytest.param([0, 1, 0], id="uneven-2+1-interleaved"),
    pytest.param([0, 1, 2], id="1+1+1"),
])
def test_every_op_across_hosts(hosts):
    results = launch(len(hosts), _all_ops, hosts, init=False)
    want = [[r for r in range(len(hosts)) if hosts[r] == h] for h in sorted(set(hosts), key=hosts.index)]
    for res in results:
        assert res["hosts"] == want


def _p2p_first(rank: int, world: int, hosts: list) -> bool:
    _init(rank, world, hosts, timeout_s=30.0)
    mc.check_p2p(rank, world)  # no collective before: the pairs' gloo groups are made by these sends and receives
    return True


@pytest.mark.parametrize("hosts", [
    pytest.param([0, 1], id="1+1"),
    pytest.param([0, 0, 1, 1], id="2+2"),
])
def test_p2p_as_the_first_operation_across_hosts(hosts):
    assert launch(len(hosts), _p2p_first, hosts, init=False) == [True] * len(hosts)


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


def _pipelined_all_reduce(rank: int, world: int, hosts: list) -> dict:
    _init(rank, world, hosts)
    mc.check_all_reduce(rank, world)
    return mc.tunedist._C.cross_host_stats(mc.tuned_backend())


@pytest.mark.parametrize("hosts", [
    pytest.param([0, 0, 1, 1], id="2x2"),
    pytest.param([0, 1, 0], id="uneven-2+1-interleaved"),
])
def test_all_reduce_pipelined_in_small_chunks(hosts, monkeypatch):
    # 4 KiB chunks: 70_001 elements run as ~70 pipeline stages, the last one with a tail on the 2-rank host.
    monkeypatch.setenv("TUNEDIST_CROSS_HOST_CHUNK_BYTES", "4096")
    for rank, stats in enumerate(launch(len(hosts), _pipelined_all_reduce, hosts, init=False)):
        assert stats["gloo_ops"] > 100, f"rank {rank}: {stats} (expected many chunked gloo operations)"


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


def _destroy_right_after_use(rank: int, world: int, hosts: list, ports: list) -> int:
    os.environ["TUNEDIST_HOST_ID"] = f"host{hosts[rank]}"
    for port in ports:
        dist.init_process_group("tuned", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        # Looked at from Python (as tests, tools and users do), the backend gets a Python object that torch keeps
        # with it: destroy_process_group then ends the backend from that object's deallocation, under the GIL.
        assert dist.group.WORLD._get_backend(torch.device("cpu")).name() == "tuned"
        t = torch.ones(1 << 20)
        dist.all_reduce(t)
        assert t[0].item() == world
        # The gloo groups between hosts may still hold the last reference to t (a Python-owned tensor) and need
        # the GIL to drop it while destroy_process_group ends them: the backend must be ended without the GIL.
        del t
        dist.destroy_process_group()
    return len(ports)


def test_destroy_right_after_a_cross_host_op_never_hangs():
    # Regression: about one destroy in 12 hung here (gloo's thread waiting for the GIL, held by the thread joining
    # it). Eight cycles on each of three ranks.
    ports = [free_port() for _ in range(8)]
    assert launch(3, _destroy_right_after_use, [0, 0, 1], ports, init=False) == [8, 8, 8]


def _host_mismatch(rank: int, world: int, hosts: list, kind: str) -> str:
    _init(rank, world, hosts)
    # Inside each host the ranks agree; the hosts do not (kind "count": all_reduce sizes, "op": the collective).
    message = "no error"
    try:
        if kind == "count":
            dist.all_reduce(torch.ones(10 if hosts[rank] == 0 else 12))
        elif hosts[rank] == 0:
            dist.all_reduce(torch.ones(10))
        else:
            dist.broadcast(torch.ones(10), src=0)
    except RuntimeError as e:
        message = str(e)
    # The store stays up until every rank has its error, as under torchrun, whose agent hosts the store: here rank 0
    # hosts it. A rank whose connections close as another host's ranks leave reads the first cause from it.
    meet_on_store("mismatch_reported", rank, world, timedelta(seconds=60))
    return message


@pytest.mark.parametrize("kind,words", [
    ("count", ("all_reduce", "disagree", "element count")),
    # Every cross-host op first has the host leaders agree in one group, so hosts calling different ops meet there:
    # an error naming both on every rank, not a wait in two different gloo groups until the 60 s timeout.
    ("op", ("disagree", "all_reduce", "broadcast")),
])
def test_hosts_that_disagree_get_a_clear_error(kind, words):
    for rank, msg in enumerate(launch(4, _host_mismatch, [0, 0, 1, 1], kind, init=False)):
        assert all(w in msg for w in words) and "Timed out" not in msg, f"rank {rank}: {msg}"


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
        victim = results[rank]
        assert isinstance(victim, RankFailure) and victim.exitcode == -signal.SIGKILL, f"rank {rank}: {victim}"
    for rank in (0, 1):
        res = results[rank]
        assert isinstance(res, dict) and res["error"], f"rank {rank}: {res}"
        assert "all_reduce" in res["error"] and "seq" in res["error"], res["error"]
        assert "dead" in res["error"] or "closed" in res["error"], res["error"]
        # Detected through the dead connections, not by running into the group timeout.
        assert res["after_s"] < timeout_s / 2, res


# ---------------------------------------------------------------------------------------------------------------
# Two torchruns as two hosts, and hosts as network namespaces.


def _start_torchrun(node: int, nnodes: int, nproc: int, endpoint: str, env: dict, prefix: list,
                    local_addr: str | None = None) -> subprocess.Popen:
    # Node 0 hosts the rendezvous store: said explicitly, since inside a namespace torch cannot tell that the
    # endpoint's address is its own (it compares with the machine's host name). Inside a namespace the node also
    # names its own address (--local-addr), which its peers use for the workers' store, not the host name.
    extra = [f"--local-addr={local_addr}"] if local_addr else []
    cmd = prefix + [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node}",
                    f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                    f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
                    "--rdzv-id=tunedist-multihost", "--max-restarts=0", *extra, str(WORKER)]
    return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(procs: list) -> list[str]:
    """Waits for every torchrun (killing all of them at the hang guard); returns their outputs."""
    deadline = time.monotonic() + TORCHRUN_GUARD_S
    outputs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                out += "\n[killed by the test's hang guard]"
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outputs


def _results(result_dir: Path, world: int, outputs: list[str]) -> list[dict]:
    results = []
    for r in range(world):
        path = result_dir / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result; torchrun output:\n" + "\n----\n".join(
            o[-3000:] for o in outputs)
        res = json.loads(path.read_text())
        assert res["ok"], f"rank {r} failed:\n{res.get('traceback')}\ntorchrun output:\n" + "\n----\n".join(
            o[-3000:] for o in outputs)
        results.append(res)
    return results


def _check_layout_and_bytes(results: list[dict], nproc: int) -> None:
    by_host: dict[str, list[int]] = {}
    for res in results:
        by_host.setdefault(res["host_id"], []).append(res["rank"])
    want = sorted(sorted(ranks) for ranks in by_host.values())
    for res in results:
        assert sorted(res["hosts"]) == want, res
        # The hierarchical all_reduce hands gloo N/L bytes per rank (L = nproc ranks per host), not N.
        assert res["gloo_bytes_4MiB"] == (4 << 20) // nproc, res


def test_two_torchruns_as_two_hosts(tmp_path):
    """torchrun started twice on this machine (--nnodes=2), 2 ranks each, distinct TUNEDIST_HOST_IDs."""
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [_start_torchrun(node, 2, 2, endpoint, {"TUNEDIST_HOST_ID": f"node{node}",
                                                    "MULTIHOST_RESULT_DIR": str(tmp_path)}, [])
             for node in range(2)]
    results = _results(tmp_path, 4, _finish(procs))
    _check_layout_and_bytes(results, 2)
    for res in results:
        assert res["ddp_max_diff"] < 1e-6, res


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _netns_allowed() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


@contextlib.contextmanager
def _two_namespaces():
    """Two network namespaces joined by a veth pair with 10.213.x addresses that exist only inside them.

    Yields [(namespace, interface, address), ...]; both namespaces (and so the veth pair) are deleted on exit,
    whatever happened.
    """
    tag = f"{os.getpid() % 100000}"
    hosts = [(f"tdmh{tag}a", f"tdv{tag}a", "10.213.7.1"), (f"tdmh{tag}b", f"tdv{tag}b", "10.213.7.2")]
    try:
        for ns, _, _ in hosts:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for ns, dev, addr in hosts:
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _tx_bytes(ns: str, dev: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                         check=True, capture_output=True, text=True).stdout
    return int(out)


@pytest.mark.skipif(not _netns_allowed() and os.environ.get("CI", "") != "true",
                    reason="needs root and iproute2 to make network namespaces (runs, and must pass, under CI=true)")
def test_network_namespaces_as_hosts(tmp_path):
    """Each host is a network namespace; gloo crosses the veth pair (GLOO_SOCKET_IFNAME), the rendezvous is on
    a namespace address, and the veth carries at least the bytes the ranks handed to gloo."""
    assert _netns_allowed(), "CI=true: this test must run, but it needs root and iproute2 (ip netns)"
    with _two_namespaces() as hosts:
        endpoint = f"{hosts[0][2]}:{free_port()}"
        before = [_tx_bytes(ns, dev) for ns, dev, _ in hosts]
        procs = [_start_torchrun(node, 2, 2, endpoint,
                                 {"TUNEDIST_HOST_ID": ns, "GLOO_SOCKET_IFNAME": dev, "MULTIHOST_CHECKS": "all_reduce",
                                  "MULTIHOST_RESULT_DIR": str(tmp_path)},
                                 ["ip", "netns", "exec", ns], local_addr=addr)
                 for node, (ns, dev, addr) in enumerate(hosts)]
        results = _results(tmp_path, 4, _finish(procs))
        sent = [_tx_bytes(ns, dev) - b for (ns, dev, _), b in zip(hosts, before)]
    _check_layout_and_bytes(results, 2)
    # Each rank's 4 MiB all_reduce alone puts 2 MiB through gloo, and gloo's only way out is the veth.
    assert min(sent) > 2 * (2 << 20), sent
