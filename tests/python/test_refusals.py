"""What `tuned` refuses on CPU tensors, with the error a user gets (docs/design.md#the-c10d-surface).

Each refusal is reached through torch's Python API. A message of tunedist's must name the operation, the rank and
the fix; where torch refuses before the backend sees the call, the test pins torch's words, so the table in
docs/design.md stays true. A refusal of the caller's own call (a send to itself, a question only a CUDA side can
answer, a reduce op the direct operator does not take, a window or a receive from any source across hosts) leaves the
group as it was: the test runs an all_reduce and a send/recv ring on it afterwards. A bad tensor passed to a
collective, and a window over a tensor outside the heap, are found on the group's executor, where peers may already
wait for that rank inside the same operation, so they fail the group and every rank raises, naming the rank at fault
(docs/design.md#execution); those run on sub-groups, and the world group is checked afterwards.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import tunedist
from dist_utils import launch

# What these refusals go through, asked of torch by capability: the Backend calls of torch 2.15 (time estimation;
# suspend, resume and memory statistics from 2.14), c10d windows and reconfigure (2.14 on).
_BACKEND = torch._C._distributed_c10d.Backend
needs_backend_calls = pytest.mark.skipif(
    not all(hasattr(_BACKEND, n) for n in ("_start_time_estimate", "suspend", "resume", "memory_stats")),
    reason="this torch's c10d Backend lacks _start_time_estimate, suspend, resume or memory_stats")
needs_windows = pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_new_window"),
                                   reason="this torch's c10d has no windows (_new_window)")
needs_reconfigure = pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_reconfigure"),
                                       reason="this torch's c10d has no _reconfigure")

NO_ERROR = "no error"


def _message(call, *args, **kwargs) -> str:
    """The text of what `call(*args, **kwargs)` raises (waiting on a Work it returns), or NO_ERROR."""
    try:
        result = call(*args, **kwargs)
        if isinstance(result, dist.Work):
            result.wait()
    except Exception as e:  # noqa: BLE001 - every refusal's type is checked by its text
        return f"{type(e).__name__}: {e}"
    return NO_ERROR


def _group_works(rank: int, world: int, group=None) -> None:
    """An all_reduce and a send/recv ring on `group` give the right values: nothing was lost."""
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((1000,), float(world * (world + 1) // 2))), t[:4]
    # A ring of an isend and an irecv posted at once on every rank.
    to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    send, recv = torch.full((7,), float(rank)), torch.empty(7)
    right, left = to_global((rank + 1) % world), to_global((rank - 1) % world)
    for work in [dist.isend(send, right, group=group), dist.irecv(recv, left, group=group)]:
        work.wait()
    assert torch.equal(recv, torch.full((7,), float((rank - 1) % world))), recv


# --- Refusals of the caller's own call, on one host: the group stays usable. ---


def _own_call_refusals(rank: int, world: int) -> dict[str, str]:
    import torch.distributed._symmetric_memory as symm_mem

    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    peer = (rank + 1) % world
    got: dict[str, str] = {}
    _group_works(rank, world)
    got["send to itself"] = _message(lambda: dist.isend(torch.ones(2), rank))
    got["recv from itself"] = _message(lambda: dist.irecv(torch.ones(2), rank))
    got["sparse send"] = _message(lambda: dist.isend(torch.ones(2).to_sparse(), peer))
    _group_works(rank, world)

    def estimate():
        with dist.distributed_c10d._time_estimator(group=pg, device=torch.device("cpu")):
            pass

    got["time estimate"] = _message(estimate)
    got["start_time_estimate"] = _message(backend._start_time_estimate)
    got["suspend"] = _message(backend.suspend)
    got["resume"] = _message(backend.resume)
    got["memory_stats"] = _message(backend.memory_stats)
    got["merge"] = _message(lambda: pg.merge_remote_group(dist.distributed_c10d._get_default_store(), world * 2))
    _group_works(rank, world)

    got["direct PREMUL_SUM"] = _message(lambda: tunedist.all_reduce(torch.ones(4), dist._make_nccl_premul_sum(2.0)))
    _group_works(rank, world)

    buf = symm_mem.empty(1024, dtype=torch.float32, device="cpu")
    symm_mem.rendezvous(buf, pg)
    got["multimem_all_reduce_"] = _message(lambda: torch.ops.symm_mem.multimem_all_reduce_(buf, "sum", pg.group_name))
    got["one_shot_all_reduce max"] = _message(lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "max",
                                                                                             pg.group_name))

    def hook(_):
        pass

    pg._register_on_completion_hook(hook)
    got["second on-completion hook"] = _message(lambda: pg._register_on_completion_hook(hook))
    got["shrink excluding itself"] = _message(lambda: dist.shrink_group([rank]))
    _group_works(rank, world)

    # An aborted group refuses every later call; the other groups go on.
    sub = dist.new_group(backend="tuned")
    _group_works(rank, world, sub)
    sub._get_backend(torch.device("cpu")).abort()
    got["all_reduce after abort"] = _message(dist.all_reduce, torch.ones(4), group=sub)
    dist.destroy_process_group(sub)
    _group_works(rank, world)

    # A setting read when a group is created: both ranks create the sub-group, and both are refused.
    os.environ["TUNEDIST_SLOT_STORES"] = "per-copy"
    try:
        got["TUNEDIST_SLOT_STORES=per-copy"] = _message(lambda: dist.new_group(backend="tuned"))
    finally:
        del os.environ["TUNEDIST_SLOT_STORES"]
    _group_works(rank, world)
    return got


@needs_backend_calls
def test_refusals_of_a_call_leave_the_group_usable():
    for rank, got in enumerate(launch(2, _own_call_refusals, pg_timeout_s=60)):
        def expect(case, *parts, rank=rank, got=got):
            msg = got[case]
            assert msg != NO_ERROR, f"rank {rank}: {case} was not refused"
            for part in parts:
                assert part in msg, f"rank {rank}: {case}: the error lacks {part!r}: {msg}"

        expect("send to itself", f"tunedist: send: rank {rank} of 2", f"rank {rank} is this rank",
               "sending to oneself is not supported")
        expect("recv from itself", f"tunedist: recv: rank {rank} of 2", "sending to oneself is not supported")
        # torch's dispatcher: c10d registers only all_reduce for sparse tensors, so no backend sees a sparse send.
        expect("sparse send", "Could not run 'c10d::send' with arguments from the 'SparseCPU' backend")
        for op in ("start_time_estimate", "suspend", "resume", "memory_stats"):
            case_op = "get_memory_stats" if op == "memory_stats" else op
            expect(op, f"tunedist: {case_op}: rank {rank} of 2: the group has no CUDA side yet",
                   "concerns only its NCCL communicator")
        # torch asks supports_time_estimate first (False without a CUDA side), and refuses with its own words.
        expect("time estimate", "collective time estimator is not supported in the current version of backend")
        expect("merge", "Backend tuned is missing implementation of merge")
        expect("direct PREMUL_SUM", "tunedist.all_reduce: unsupported reduce op",
               "for PREMUL_SUM use torch.distributed")
        expect("multimem_all_reduce_", "tunedist: symm_mem::multimem_all_reduce_: CPU symmetric memory has no "
               "multicast", "use symm_mem.one_shot_all_reduce or two_shot_all_reduce_")
        expect("one_shot_all_reduce max", "one_shot_all_reduce", "reduce_op 'max' is not supported; only 'sum' is")
        expect("second on-completion hook", f"tunedist: register_on_completion_hook on rank {rank}",
               "already has an on-completion hook")
        # torch checks this before the backend's shrink (whose own refusal test_abort_shrink.py checks).
        expect("shrink excluding itself", f"Current rank {rank} is in the exclusion list and should not call "
               "shrink_group()", "Excluded ranks should terminate their processes instead")
        expect("all_reduce after abort", f"on rank {rank}: the process group was shut down or aborted")
        expect("TUNEDIST_SLOT_STORES=per-copy",
               "TUNEDIST_SLOT_STORES must be auto, cached or streaming, got 'per-copy'")


# --- A bad tensor passed to a collective: the group fails on every rank, naming the rank at fault. ---


def _collective_refusals(rank: int, world: int) -> dict[str, list[str]]:
    """Each case on a sub-group of its own: rank 0 makes the mistake, rank 1 calls correctly. Returns, per case, the
    error of the call and of a later all_reduce on that sub-group."""
    ints = torch.arange(8, dtype=torch.int32)
    sparse = torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (5,), check_invariants=True)
    cases = {
        "integer PREMUL_SUM": (lambda g: dist.all_reduce(ints.clone(), op=dist._make_nccl_premul_sum(2.0), group=g),
                               lambda g: dist.all_reduce(ints.clone(), group=g)),
        "sparse MAX": (lambda g: dist.all_reduce(sparse.clone(), op=dist.ReduceOp.MAX, group=g),
                       lambda g: dist.all_reduce(sparse.clone(), group=g)),
        "uint16 all_reduce": (lambda g: dist.all_reduce(torch.ones(8, dtype=torch.uint16), group=g),
                              lambda g: dist.all_reduce(torch.ones(8, dtype=torch.int32), group=g)),
        # Not a collective, but it runs as one on the group's executor, so its refusal fails the group too.
        "window outside the heap": (lambda g: g._get_backend(torch.device("cpu")).new_window(torch.ones(64)),
                                    lambda g: g._get_backend(torch.device("cpu")).new_window(
                                        tunedist.symmetric_empty(64, group=g))),
    }
    got = {}
    for case, (bad, good) in cases.items():
        group = dist.new_group(backend="tuned")
        call = bad if rank == 0 else good
        got[case] = [_message(call, group), _message(dist.all_reduce, torch.ones(4), group=group)]
        dist.destroy_process_group(group)
    _group_works(rank, world)
    return got


def test_a_bad_tensor_fails_the_group_on_every_rank():
    results = launch(2, _collective_refusals, pg_timeout_s=60)
    fixes = {"integer PREMUL_SUM": "PREMUL_SUM is not supported for int32 (floating types only)",
             "sparse MAX": "can only be summed (ReduceOp.SUM), as with gloo",
             "uint16 all_reduce": "supported: float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool",
             "window outside the heap": "is not in this rank's symmetric heap of the group: allocate it from this "
                                        "group's heap"}
    ops = {"window outside the heap": "Window.tensor_register"}
    for rank, got in enumerate(results):
        for case, (first, later) in got.items():
            assert first != NO_ERROR, f"rank {rank}: {case}: the call was not refused"
            # Rank 0 made the mistake: its own error and rank 1's both name rank 0 and the fix.
            assert "rank 0" in first and fixes[case] in first, f"rank {rank}: {case}: {first}"
            assert later != NO_ERROR and "rank 0" in later, f"rank {rank}: {case}: the group went on: {later}"
            op = ops.get(case, "all_reduce")
            assert f"tunedist: {op}: rank 0 of 2: " in first, f"rank {rank}: {case}: the op is not named: {first}"
            assert "Destroy the group" in later, f"rank {rank}: {case}: {later}"


# --- Two hosts (simulated with TUNEDIST_HOST_ID): what needs every rank on one host. ---


def _two_hosts(rank: int, world: int) -> dict[str, str]:
    import torch.distributed._symmetric_memory as symm_mem

    os.environ["TUNEDIST_HOST_ID"] = f"host{rank}"
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    _group_works(rank, world)
    got = {"supports_window": str(dist.distributed_c10d._supports_window())}
    if rank == 0:
        got["recv from any source"] = _message(lambda: dist.recv(torch.empty(3)))
    _group_works(rank, world)
    buf = symm_mem.empty(1024, dtype=torch.float32, device="cpu")
    got["new_window"] = _message(lambda: dist.distributed_c10d._new_window(buf))
    got["symm_mem.rendezvous"] = _message(lambda: symm_mem.rendezvous(buf, dist.group.WORLD))
    _group_works(rank, world)
    return got


@needs_windows
def test_across_hosts_the_one_host_features_are_refused():
    for rank, got in enumerate(launch(2, _two_hosts, init=False)):
        assert got["supports_window"] == "False", got
        if rank == 0:
            msg = got["recv from any source"]
            assert "tunedist: recv from any source on rank 0: this group spans several hosts" in msg, msg
            assert "a receive must name its source rank" in msg, msg
        assert f"tunedist: new_window: rank {rank} of 2: the group spans 2 hosts" in got["new_window"], got
        assert "symm_mem_rendezvous: the group spans several hosts" in got["symm_mem.rendezvous"], got
        assert "need every rank on one host" in got["symm_mem.rendezvous"], got


# --- A group made with enable_reconfigure=True has no members until it is reconfigured. ---


def _before_reconfigure(rank: int, world: int) -> dict[str, str]:
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60), enable_reconfigure=True)
    got = {"all_reduce": _message(lambda: dist.all_reduce(torch.ones(4))),
           "send": _message(lambda: dist.isend(torch.ones(4), (rank + 1) % world))}
    # The handles' out-of-band exchange, over the group's store; then the group has members and works.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"handle{rank}", dist.distributed_c10d._get_reconfigure_handle())
    handles = [store.get(f"handle{r}").decode() for r in range(world)]
    dist.distributed_c10d._reconfigure(7, handles)
    _group_works(rank, world)
    return got


@needs_reconfigure
def test_before_reconfigure_every_operation_is_refused():
    for rank, got in enumerate(launch(2, _before_reconfigure, init=False)):
        for op, msg in got.items():
            assert msg != NO_ERROR, f"rank {rank}: {op} ran before reconfigure"
            assert f"rank {rank} of 2: this group was created with enable_reconfigure=True" in msg, (op, msg)
            assert "_reconfigure(uuid, handles, group) first" in msg, (op, msg)
