"""The backend as torch sees it: registration, the Backend and Work objects, profiler titles, import guards, and
initialisation variants (backend strings, destroy then init again, TORCH_DISTRIBUTED_DEBUG=DETAIL)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import free_port, init_url, launch, make_input, reference

IMPORT_TIMEOUT_S = 180


def test_registration():
    import tunedist

    assert "tuned" in dist.Backend.backend_list
    assert dist.Backend.TUNED == "tuned"
    assert tunedist.BACKEND_NAME == "tuned"
    assert "tuned" in tunedist.version()
    assert tunedist.simd_level() in ("scalar", "avx2", "avx512")


def _op_type_calls(pg, t: torch.Tensor, rank: int, w: int) -> list:
    """(expected OpType, a call that issues that op async and returns its Work), one per collective."""
    OpType = torch._C._distributed_c10d.OpType
    out = torch.empty(w * t.numel())
    return [
        (OpType.ALLREDUCE, lambda: dist.all_reduce(t, async_op=True)),
        (OpType.BROADCAST, lambda: dist.broadcast(t, src=0, async_op=True)),
        (OpType.REDUCE, lambda: dist.reduce(t, dst=0, async_op=True)),
        (OpType.ALLGATHER, lambda: dist.all_gather([torch.empty_like(t) for _ in range(w)], t, async_op=True)),
        (OpType._ALLGATHER_BASE, lambda: dist.all_gather_into_tensor(out, t, async_op=True)),
        (OpType.REDUCE_SCATTER, lambda: dist.reduce_scatter(t, list(out.chunk(w)), async_op=True)),
        (OpType._REDUCE_SCATTER_BASE, lambda: dist.reduce_scatter_tensor(t, out, async_op=True)),
        (OpType.ALLTOALL_BASE, lambda: dist.all_to_all_single(torch.empty(w * 3), torch.ones(w * 3),
                                                              async_op=True)),
        (OpType.ALLTOALL, lambda: dist.all_to_all([torch.empty(2) for _ in range(w)],
                                                  [torch.ones(2) for _ in range(w)], async_op=True)),
        (OpType.GATHER, lambda: dist.gather(t, [torch.empty_like(t) for _ in range(w)] if rank == 0 else None,
                                            dst=0, async_op=True)),
        (OpType.SCATTER, lambda: dist.scatter(t, [torch.ones_like(t) for _ in range(w)] if rank == 0 else None,
                                              src=0, async_op=True)),
        # (dist.all_reduce_coalesced hands back a Future, so call the group for the Work)
        (OpType.ALLREDUCE_COALESCED, lambda: pg.allreduce_coalesced([t, torch.ones(3)],
                                                                    dist.AllreduceCoalescedOptions())),
        (OpType.BARRIER, lambda: dist.barrier(async_op=True)),
    ]


def _backend_objects(rank: int, world_size: int) -> dict:
    from torch._C._distributed_c10d import Backend

    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    # The creator received torch's Store and returned a Backend torch accepts: the cross-module cast worked.
    assert isinstance(backend, Backend), type(backend)
    assert backend.name() == "tuned", backend.name()
    assert dist.get_backend() == "tuned"
    assert backend.rank() == rank and backend.size() == world_size
    seq = backend._get_sequence_number_for_group

    seq0 = seq()
    t = torch.full((1001,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    value = work.get_future().wait()
    assert work.is_completed()
    assert isinstance(value, list) and len(value) == 1 and value[0].data_ptr() == t.data_ptr(), value
    assert torch.equal(t, torch.full((1001,), float(sum(range(world_size)))))
    assert work.result()[0].data_ptr() == t.data_ptr()
    assert seq() == seq0 + 1 and work._get_sequence_number() == seq0 + 1, (seq0, seq(), work._get_sequence_number())

    # Every Work carries its op type and the group's next sequence number, whatever the op.
    problems = []
    for expected, call in _op_type_calls(pg, t, rank, world_size):
        before = seq()
        work = call()
        work.wait()
        if work._get_op_type() != int(expected):
            problems.append(f"{expected}: the work says {work._get_op_type()}")
        if work._get_sequence_number() != before + 1 or seq() != before + 1:
            problems.append(f"{expected}: work seq {work._get_sequence_number()}, group seq {before} -> {seq()}")
    assert not problems, problems
    # A sub-group counts on its own.
    sub = dist.new_group(list(range(world_size)))
    before = seq()
    dist.all_reduce(t, group=sub)
    assert sub._get_backend(torch.device("cpu"))._get_sequence_number_for_group() == 1 and seq() == before

    # Every op shows up in the profiler under its title.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, src=world_size - 1)
        out = torch.empty(world_size * 1001)
        dist.all_gather_into_tensor(out, t)
        dist.reduce_scatter_tensor(t, out)
        dist.all_reduce(t, async_op=True).wait()
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
    return {"names": sorted({e.name for e in prof.events() if e.name.startswith("tuned:")})}


@pytest.mark.skipif(not hasattr(torch._C._distributed_c10d.Work, "_get_sequence_number"),
                    reason="this torch's Work has no _get_sequence_number (torch 2.11)")
def test_backend_objects_work_and_profiler():
    results = launch(2, _backend_objects)
    for rank, res in enumerate(results):
        for title in ("tuned:all_reduce", "tuned:broadcast", "tuned:all_gather_into_tensor",
                      "tuned:reduce_scatter_tensor"):
            assert title in res["names"], f"rank {rank}: no profiler event {title!r}; got {res['names']}"
        p2p = {0: "tuned:send", 1: "tuned:recv"}.get(rank)
        assert p2p is None or p2p in res["names"], f"rank {rank}: no profiler event {p2p!r}; got {res['names']}"


def _import_env(**extra) -> dict:
    """The environment for a child interpreter that imports the same tunedist as this test process."""
    import tunedist

    env = dict(os.environ)
    pkg_parent = str(Path(tunedist.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_parent, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _run_children(probes: dict) -> dict:
    """Runs each {name: (python code, env)} in a child interpreter at once (each pays for importing torch) and
    returns {name: its stdout and stderr}; children still running on the way out are killed."""
    procs = {name: subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name, (code, env) in probes.items()}
    outputs = {}
    try:
        for name, p in procs.items():
            outputs[name] = p.communicate(timeout=IMPORT_TIMEOUT_S)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs


def test_import_guards():
    """Two children at once (each pays for importing torch): a torch version mismatch, and TorchComms mode (refused
    only on a torch that would bypass plugin backends)."""
    version_probe = (
        "import torch\n"
        "torch.__version__ = '0.0.1+not-the-build'\n"
        "try:\n"
        "    import tunedist\n"
        "except ImportError as e:\n"
        "    print('IMPORT_ERROR', e)\n"
        "else:\n"
        "    print('IMPORTED')\n"
    )
    torchcomms_probe = (
        "try:\n"
        "    import tunedist\n"
        "except RuntimeError as e:\n"
        "    print('RUNTIME_ERROR', e)\n"
        "else:\n"
        "    print('IMPORTED')\n"
    )
    outputs = _run_children({"version": (version_probe, _import_env()),
                             "torchcomms": (torchcomms_probe, _import_env(TORCH_DISTRIBUTED_USE_TORCHCOMMS="1"))})
    out = outputs["version"]
    assert "IMPORT_ERROR" in out and "rebuild" in out.lower() and "0.0.1+not-the-build" in out, out
    out = outputs["torchcomms"]
    # This torch asks TorchComms per backend name and lets plugins fall through (test_entry_point.py runs groups
    # with the variable set); the refusal is left for a torch that bypasses plugins.
    if hasattr(dist.distributed_c10d, "_torchcomms_handles_backend"):
        assert "IMPORTED" in out, out
    else:
        assert ("RUNTIME_ERROR" in out and "TORCH_DISTRIBUTED_USE_TORCHCOMMS" in out) or "IMPORTED" in out, out


_FLIGHT_RECORDER_PROBE = (
    "import torch, torch.distributed as dist\n"
    "import tunedist\n"
    "dist.init_process_group('tuned', store=dist.HashStore(), rank=0, world_size=1)\n"
    "t = torch.ones(4)\n"
    "dist.all_reduce(t)\n"
    "hooks = dist.distributed_c10d._world.pg_flight_recorder_hooks\n"
    "print('HOOKED' if dist.group.WORLD in hooks else 'NOT_HOOKED', tunedist.flight_recorder_enabled(), t.tolist())\n"
    "opts = dist.AllreduceOptions()\n"
    "opts.asyncOp = False\n"
    "print('SYNC_RETURNS', type(dist.group.WORLD.allreduce([t], opts)).__name__)\n"
    "dist.destroy_process_group()\n"
)


@pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS"),
                    reason="this torch attaches no flight-recorder hook to plugin backends")
def test_flight_recorder_hook_only_when_asked():
    """torch's per-call flight-recorder hook is skipped for tuned by default and attached with
    TUNEDIST_FLIGHT_RECORDER=1; either way the all_reduce is right. With the hook, synchronous calls return a Work
    (the recorder closes an entry only for a call that returned one)."""
    envs = {"": _import_env(), "1": _import_env(TUNEDIST_FLIGHT_RECORDER="1")}
    envs[""].pop("TUNEDIST_FLIGHT_RECORDER", None)
    outputs = _run_children({value: (_FLIGHT_RECORDER_PROBE, env) for value, env in envs.items()})
    assert "NOT_HOOKED False [1.0, 1.0, 1.0, 1.0]" in outputs[""], outputs[""]
    assert "HOOKED True [1.0, 1.0, 1.0, 1.0]" in outputs["1"] and "NOT_HOOKED" not in outputs["1"], outputs["1"]
    assert "SYNC_RETURNS NoneType" in outputs[""], outputs[""]
    assert "SYNC_RETURNS Work" in outputs["1"], outputs["1"]


def _cuda_tensor_on_cpu_group(rank: int, world_size: int) -> str:
    t = torch.ones(4, device="cuda:0")
    try:
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to make a CUDA tensor")
def test_cuda_tensor_on_cpu_only_group_fails_clearly():
    results = launch(2, _cuda_tensor_on_cpu_group, backend="cpu:tuned")
    for rank, msg in enumerate(results):
        assert msg, f"rank {rank}: all_reduce of a CUDA tensor on a cpu:tuned group did not fail"
        assert "cuda" in msg.lower(), f"rank {rank}: the error does not mention CUDA: {msg}"


# Initialisation variants, each in its own launch.


def _reinit_and_backend_strings(rank: int, world_size: int, ports: list[int]) -> list[str]:
    # torch creates the NCCL backend eagerly and that needs a GPU; without one, a mixed string with gloo for CUDA
    # still checks that a multi-device string maps the CPU to "tuned".
    mixed = "cpu:tuned,cuda:nccl" if dist.is_nccl_available() and torch.cuda.is_available() else "cpu:tuned,cuda:gloo"
    backends = ["cpu:tuned", mixed, "tuned"]
    for backend, port in zip(backends, ports):
        dist.init_process_group(backend, init_method=init_url(port), rank=rank, world_size=world_size)
        try:
            assert dist.get_backend() in (backend, "tuned"), dist.get_backend()
            cpu_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
            assert cpu_backend.name() == "tuned", f"{backend}: the CPU backend is {cpu_backend.name()}"
            t = torch.full((1001,), float(rank + 1))
            dist.all_reduce(t)
            assert torch.equal(t, torch.full((1001,), float(world_size * (world_size + 1) // 2))), (backend, t[:4])
            b = torch.full((5,), rank)
            dist.broadcast(b, src=world_size - 1)
            assert torch.equal(b, torch.full((5,), world_size - 1)), (backend, b)
        finally:
            dist.destroy_process_group()
        assert not dist.is_initialized()
    return backends


def test_destroy_then_init_again_with_backend_strings():
    ports = [free_port() for _ in range(3)]
    results = launch(2, _reinit_and_backend_strings, ports, init=False)
    assert results[0] == results[1]


def _debug_detail(rank: int, world_size: int) -> None:
    from torch.distributed import DebugLevel, get_debug_level

    assert get_debug_level() == DebugLevel.DETAIL
    inputs = [make_input(torch.float32, 1001, r, "dbg") for r in range(world_size)]
    t = inputs[rank].clone()
    dist.all_reduce(t)
    assert torch.equal(t, reference("SUM", inputs))
    b = make_input(torch.float32, 1001, rank, "dbgb")
    dist.broadcast(b, src=1)
    assert torch.equal(b, make_input(torch.float32, 1001, 1, "dbgb"))
    outs = [torch.empty(1001) for _ in range(world_size)]
    dist.all_gather(outs, inputs[rank])
    for p in range(world_size):
        assert torch.equal(outs[p], inputs[p])


def test_torch_distributed_debug_detail():
    launch(2, _debug_detail, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


# A future callback that issues another collective and waits for it (torch's PowerSGD hook does this). The callback
# runs on the backend's worker thread, which must hand its queue to another thread instead of deadlocking.


def _collective_inside_callback(rank: int, world_size: int) -> list[float]:
    x = torch.full((4,), float(rank + 1))

    def then_all_reduce_again(fut):
        y = fut.value()[0] * 2
        dist.all_reduce(y, async_op=True).get_future().wait()  # waits on the thread that completed `fut`
        dist.all_reduce(y)  # a synchronous call from the same callback
        return y

    chained = dist.all_reduce(x, async_op=True).get_future().then(then_all_reduce_again)
    out = chained.wait()
    # The group still works afterwards, from the main thread.
    z = torch.ones(3)
    dist.all_reduce(z)
    assert torch.equal(z, torch.full((3,), float(world_size))), z
    return out.tolist()


def test_collective_issued_and_waited_inside_a_future_callback():
    for world_size in (2, 3):
        results = launch(world_size, _collective_inside_callback)
        total = world_size * (world_size + 1) / 2
        # sum, doubled, then summed twice more over the ranks
        expected = [total * 2 * world_size * world_size] * 4
        assert all(r == expected for r in results), results


# A group of one rank has nobody to wait for: its async calls run inline and return completed Works, with the same
# results, futures and callbacks as the queued path of a larger group (whose async Works the worker completes).


def _one_rank_group_async(rank: int, world_size: int) -> dict:
    one = dist.new_subgroups(group_size=1, backend="tuned")[0]
    x = torch.full((1001,), float(rank + 1))
    work = dist.all_reduce(x, group=one, async_op=True)
    done_on_return = work.is_completed()
    work.wait()
    out = torch.empty(1001)
    dist.all_gather_into_tensor(out, x, group=one, async_op=True).wait()
    seen = []
    fut = dist.all_reduce(x, group=one, async_op=True).get_future()
    chained = fut.then(lambda f: seen.append(f.value()[0].sum().item()) or f.value()[0] * 2)
    doubled = chained.wait()
    # the whole job's group still queues its async calls and completes them
    y = torch.full((5,), float(rank + 1))
    dist.all_reduce(y, async_op=True).wait()
    return {"done_on_return": done_on_return, "x": x[0].item(), "gathered": out[0].item(),
            "seen": seen, "doubled": doubled[0].item(), "y": y[0].item()}


def test_one_rank_group_runs_async_calls_inline():
    results = launch(2, _one_rank_group_async)
    for rank, res in enumerate(results):
        v = float(rank + 1)
        assert res == {"done_on_return": True, "x": v, "gathered": v, "seen": [1001 * v], "doubled": 2 * v,
                       "y": 3.0}, f"rank {rank}: {res}"


def _split_and_bound_device_groups(rank: int, world_size: int, port: int) -> dict:
    # A bound device makes torch split the parent backend: dist.split_group asks it directly, DeviceMesh and
    # new_group (whose non-members call perform_nocolor_split on the parent) go through it too.
    try:
        dist.init_process_group("tuned", init_method=init_url(port), rank=rank, world_size=world_size,
                                device_id=torch.device("cpu", 0))
    except ValueError as e:  # torch 2.11 binds accelerators only ("must be an accelerator with an index")
        if "accelerator" not in str(e):
            raise
        return {"no_cpu_binding": str(e)}
    parent = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert parent.supports_splitting, "the tuned backend should support splitting"
    pairs = [[0, 2], [1, 3]]
    sub = dist.split_group(split_ranks=pairs, timeout=timedelta(seconds=120))
    mine = next(p for p in pairs if rank in p)
    t = torch.full((1001,), float(rank + 1))
    dist.all_reduce(t, group=sub)
    gathered = [torch.empty(2) for _ in mine]
    dist.all_gather(gathered, torch.full((2,), float(rank)), group=sub)
    # ranks 2 and 3 are not members: torch has them call perform_nocolor_split on the parent backend
    low = dist.new_group([0, 1])
    low_sum = None
    if rank < 2:
        u = torch.full((3,), float(rank + 1))
        dist.all_reduce(u, group=low)
        low_sum = u[0].item()
    w = torch.ones(4)
    dist.all_reduce(w)  # the parent still works
    return {"backend": dist.get_backend(sub), "type": type(sub._get_backend(torch.device("cpu"))).__name__,
            "sub_rank": dist.get_rank(sub), "sum": t[0].item(), "uniform": bool((t == t[0]).all()),
            "gathered": [g[0].item() for g in gathered], "low": low_sum, "world": w[0].item()}


def test_split_group_and_new_group_with_a_bound_device():
    if not hasattr(dist, "split_group"):
        pytest.skip("this torch has no dist.split_group")
    results = launch(4, _split_and_bound_device_groups, free_port(), init=False)
    if all("no_cpu_binding" in r for r in results):
        pytest.skip(f"this torch does not bind a group to a CPU device: {results[0]['no_cpu_binding']}")
    for rank, r in enumerate(results):
        pair = [0, 2] if rank % 2 == 0 else [1, 3]
        assert r["backend"] == "tuned" and r["type"] == "TunedBackend", r
        assert r["sub_rank"] == pair.index(rank), r
        assert r["uniform"] and r["sum"] == sum(p + 1 for p in pair), r
        assert r["gathered"] == [float(p) for p in pair], r
        assert r["low"] == (3.0 if rank < 2 else None), r
        assert r["world"] == 4.0, r


# A synchronous call that ran inline hands torch no Work: torch's contract for a backend that synchronised at the
# C++ level (torch.distributed waits only on a Work it got back, for every collective that passes async_op). The
# call still takes the group's next sequence number, and a Work is still made where something needs one: a profiler
# (the event rides on it; test_backend_objects_work_and_profiler), torch registering Works for wait_tensor, and
# TUNEDIST_SYNC_WORK=always.


def _sync_calls_and_their_works(rank: int, world_size: int) -> dict:
    from torch.distributed._functional_collectives import allow_inflight_collective_as_graph_input_ctx
    from torch.utils._python_dispatch import TorchDispatchMode

    pg = dist.group.WORLD
    seq = pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group
    t = torch.full((1001,), float(rank + 1))
    total = float(sum(range(1, world_size + 1)))
    got: dict = {}

    def options(cls, asynchronous: bool):
        opts = cls()
        opts.asyncOp = asynchronous
        return opts

    before = seq()
    got["allreduce"] = type(pg.allreduce([t], options(dist.AllreduceOptions, False))).__name__
    got["broadcast"] = type(pg.broadcast([t], options(dist.BroadcastOptions, False))).__name__
    out = torch.empty(world_size * 1001)
    gather_opts = options(torch._C._distributed_c10d.AllgatherOptions, False)
    got["allgather_base"] = type(pg._allgather_base(out, t, gather_opts)).__name__
    got["barrier"] = type(pg.barrier(options(dist.BarrierOptions, False))).__name__
    got["seq_advanced"] = seq() - before
    got["allreduced"] = t[0].item()
    # the same calls asynchronous (torch's default options) return a Work
    work = pg.allreduce([t], dist.AllreduceOptions())
    got["async"] = type(work).__name__
    work.wait()

    # a Python dispatch mode sees the c10d operator (boxed) and passes it on
    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            got.setdefault("mode_saw", []).append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.ones(7)
    with PassThrough():
        dist.all_reduce(x)
    got["under_mode"] = x[0].item()
    # torch registers the Work of every call for wait_tensor: a Work is made
    y = torch.ones(7)
    with allow_inflight_collective_as_graph_input_ctx():
        dist.all_reduce(y)
        torch.ops._c10d_functional.wait_tensor(y)
        got["inflight_work"] = type(pg.allreduce([y], options(dist.AllreduceOptions, False))).__name__
    got["inflight"] = y[0].item()
    got["total"] = total
    return got


def test_synchronous_calls_that_ran_inline_return_no_work():
    results = launch(2, _sync_calls_and_their_works)
    for rank, res in enumerate(results):
        assert res["allreduce"] == res["broadcast"] == res["allgather_base"] == res["barrier"] == "NoneType", \
            f"rank {rank}: {res}"
        assert res["seq_advanced"] == 4, f"rank {rank}: {res}"
        assert res["allreduced"] == res["total"], f"rank {rank}: {res}"
        assert res["async"] == "Work" and res["inflight_work"] == "Work", f"rank {rank}: {res}"
        assert "c10d.allreduce_.default" in res["mode_saw"] and res["under_mode"] == 2.0, f"rank {rank}: {res}"
        assert res["inflight"] == 4.0, f"rank {rank}: {res}"


def _sync_work_always(rank: int, world_size: int) -> dict:
    pg = dist.group.WORLD
    t = torch.ones(5)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = pg.allreduce([t], opts)
    return {"type": type(work).__name__, "done": work is not None and work.is_completed(), "value": t[0].item()}


def test_sync_work_always_returns_a_completed_work():
    results = launch(2, _sync_work_always, env={"TUNEDIST_SYNC_WORK": "always"})
    assert results == [{"type": "Work", "done": True, "value": 2.0}] * 2, results
    failures = launch(2, _sync_work_always, env={"TUNEDIST_SYNC_WORK": "sometimes"}, return_exceptions=True)
    for f in failures:
        assert "TUNEDIST_SYNC_WORK" in str(f) and "inline-none or always" in str(f) and "sometimes" in str(f), f
