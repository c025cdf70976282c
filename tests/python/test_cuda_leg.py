"""A plain ``tuned`` group's CUDA side, as far as a machine without a GPU can see it: which backend it is made by
(torch's own registered creator for ``"nccl"``: nccl2 on torch 2.15, the classic ProcessGroupNCCL with
TORCH_DIST_USE_NCCL2=0), what that creator is given (the group's store, name, ranks, timeout and the group itself, as
torch gives it to ``"nccl"``), that a CPU-only job never makes it, and what the group forwards once it exists. The
creator is replaced by one that records its arguments and returns a real c10d backend (gloo's) where a GPU is needed;
the forwarding of every c10d call is checked in C++ (tests/cpp/backend/test_cuda_forwarding.cpp)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import tunedist
from dist_utils import launch

needs_nccl_side = pytest.mark.skipif(not tunedist.nccl_compiled_in(), reason="this tunedist build has no CUDA side")
needs_plugin_nccl = pytest.mark.skipif(not hasattr(dist.Backend, "_ensure_backend_registered"),
                                       reason="this torch builds \"nccl\" itself, not through a registered creator")
CHILD_TIMEOUT_S = 300  # a hang guard for the child interpreter, not a measurement

_CREATOR_PROBE = textwrap.dedent('''
    import sys
    import torch.distributed as dist
    import tunedist
    plugin = tunedist.nccl_creator()
    print("CREATOR", plugin.creator_fn.__module__ + "." + plugin.creator_fn.__qualname__, plugin.extended_api)
    print("CUDA_TOUCHED", "torch.cuda" in sys.modules and __import__("torch").cuda.is_initialized())
''')


def _creator_in_fresh_process(**env) -> str:
    child_env = {k: v for k, v in os.environ.items() if k != "TORCH_DIST_USE_NCCL2"}
    child_env.update(env)
    out = subprocess.run([sys.executable, "-c", _CREATOR_PROBE], env=child_env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=CHILD_TIMEOUT_S).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("CREATOR", "CUDA_TOUCHED")))
    assert "CREATOR" in lines, out
    assert lines["CUDA_TOUCHED"] == "False", out  # choosing the creator initializes no CUDA
    return lines["CREATOR"]


@needs_plugin_nccl
def test_the_cuda_side_is_made_by_torchs_creator_for_nccl():
    """What "nccl" means in this torch, decided as torch decides it: nccl2 unless TORCH_DIST_USE_NCCL2=0."""
    default = _creator_in_fresh_process()
    legacy = _creator_in_fresh_process(TORCH_DIST_USE_NCCL2="0")
    assert default == "torch.distributed.distributed_c10d._create_nccl2_process_group True", default
    assert legacy == "torch.distributed.distributed_c10d._create_nccl_process_group True", legacy


def test_without_a_registered_creator_the_cpp_side_chooses(monkeypatch):
    """A torch that builds "nccl" inline (no registered creator): the factory answers None, and the C++ side makes
    the classic ProcessGroupNCCL, as that torch does."""
    monkeypatch.setattr(dist.Backend, "_plugins", {k: v for k, v in dist.Backend._plugins.items() if k != "NCCL"})
    monkeypatch.setattr(dist.Backend, "_ensure_backend_registered", classmethod(lambda cls, name: None),
                        raising=False)
    assert tunedist.nccl_creator() is None
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.group_id = "0"
    side = tunedist._CudaSide(opts, None)
    assert side(dist.HashStore(), 0, 1, timedelta(seconds=5), "0", None) is None


def test_pg_options_other_than_nccls_are_refused():
    opts = dist.distributed_c10d._DistributedBackendOptions()
    with pytest.raises(TypeError, match="pg_options of type object: a `tuned` group takes ProcessGroupNCCL.Options"):
        tunedist._CudaSide(opts, object())
    nccl_options = getattr(getattr(dist, "ProcessGroupNCCL", None), "Options", None)
    if nccl_options is not None:
        assert tunedist._CudaSide(opts, nccl_options()).options is not None


def _stand_in_nccl(rank: int, world: int) -> dict:
    """Replaces torch's creator for "nccl" with one that records what it is given and returns gloo's backend over the
    store it got (so the two ranks' CUDA sides must meet through that store), then has torch bind the group to a CUDA
    device the way init_process_group(device_id=...) does."""
    seen = []

    def creator(opts, backend_options):
        seen.append({"group_id": opts.group_id, "rank": opts.group_rank, "size": opts.group_size,
                     "ranks": list(opts.global_ranks_in_group), "timeout_s": opts.timeout.total_seconds(),
                     "group_is_world": opts.process_group is dist.group.WORLD, "options": backend_options})
        return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)

    plugin = dist.Backend._BackendPlugin(creator, True)
    dist.Backend._ensure_backend_registered("nccl")
    dist.Backend._plugins["NCCL"] = plugin
    dist.init_process_group("tuned", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=77))
    got = {}
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    t = torch.ones(16)
    dist.all_reduce(t)
    got["cpu_only_made_it"] = tunedist._C.nccl_side(backend) is not None or bool(seen)
    got["keyed_hooks_before"] = getattr(backend, "supports_completion_hooks", None)
    # torch binds a group and connects it at once for init_process_group(device_id=cuda:k).
    backend.eager_connect_single_device(torch.device("cuda", 0))
    side = tunedist._C.nccl_side(backend)
    got["side"] = type(side).__name__
    got["seen"] = seen
    # The CUDA side is a real backend over the store the two ranks share: a collective on it meets the peer.
    u = torch.full((5,), float(rank + 1))
    side.allreduce([u]).wait()
    got["side_all_reduce"] = u.tolist()
    # Questions the NCCL side answers once it exists: gloo's answers combined with the CPU side's.
    got["supports_reconfigure"] = getattr(backend, "supports_reconfigure", None)
    got["keyed_hooks_after"] = getattr(backend, "supports_completion_hooks", None)
    got["hook_warning"] = _warnings_of(lambda: dist.group.WORLD._register_on_completion_hook(lambda info: None))
    got["world_name"] = dist.group.WORLD.group_name
    # Reconfigure with both sides: each member's handle carries its CPU and CUDA parts; a set of them re-forms the
    # CPU side and gloo in one order, after which both sides still meet the peer.
    if got["supports_reconfigure"]:
        handle = c10d._get_reconfigure_handle()
        handles = [None] * world
        dist.all_gather_object(handles, handle)
        got["handle_prefix"] = handle[:7]
        c10d._reconfigure(4242, set(handles)).wait()
        got["rank_after"] = dist.get_rank()
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)
        got["cpu_after"] = t.tolist()
        u = torch.full((2,), float(rank + 1))
        tunedist._C.nccl_side(backend).allreduce([u]).wait()
        got["side_after"] = u.tolist()
        got["side_is_same"] = tunedist._C.nccl_side(backend) is side
    dist.destroy_process_group()
    return got


def _warnings_of(call) -> str:
    """What `call` warns, as a Python warning or as c10's warning line on stderr (file descriptor 2)."""
    import tempfile
    import warnings

    with tempfile.TemporaryFile(mode="w+") as err, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return " ".join([str(w.message) for w in caught] + [err.read()])


@needs_nccl_side
@needs_plugin_nccl
def test_cuda_side_through_the_registered_creator_with_a_stand_in():
    results = launch(2, _stand_in_nccl, init=False)
    for rank, r in enumerate(results):
        assert r["cpu_only_made_it"] is False, r  # CPU collectives never make the CUDA side
        assert r["side"] == "ProcessGroupGloo", r
        assert len(r["seen"]) == 1, r
        seen = r["seen"][0]
        assert seen["rank"] == rank and seen["size"] == 2 and seen["group_is_world"], seen
        assert seen["group_id"] == r["world_name"] and seen["timeout_s"] == 77.0 and seen["options"] is None, seen
        assert r["side_all_reduce"] == [3.0] * 5, r
        if r["keyed_hooks_before"] is not None:
            assert r["keyed_hooks_before"] is True, r  # the CPU side's answer while there is no CUDA side
            assert r["keyed_hooks_after"] is False, r  # gloo reports none: the group says so
        if r["supports_reconfigure"] is not None:
            assert r["supports_reconfigure"] is True, r  # gloo can, and so can the CPU side
            assert r["handle_prefix"] == "tuned2:", r
            assert r["rank_after"] == rank, r  # a set is ordered by stable rank: both keep their ranks
            assert r["cpu_after"] == [3.0] * 3 and r["side_after"] == [3.0] * 2, r
            assert r["side_is_same"] is True, r  # re-formed in place, not made again
        assert "reports the CPU operations only" in r["hook_warning"] and "gloo" in r["hook_warning"], r
