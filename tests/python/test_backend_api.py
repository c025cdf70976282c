"""The backend as torch sees it: registration, the Backend and Work objects, profiler titles, and import guards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import launch

IMPORT_TIMEOUT_S = 180


def test_registration():
    import tunedist

    assert "tuned" in dist.Backend.backend_list
    assert dist.Backend.TUNED == "tuned"
    assert tunedist.BACKEND_NAME == "tuned"
    assert "tuned" in tunedist.version()
    assert tunedist.simd_level() in ("scalar", "avx2", "avx512")


def _backend_objects(rank: int, world_size: int) -> dict:
    from torch._C._distributed_c10d import Backend

    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    # The creator received torch's Store and returned a Backend torch accepts: the cross-module cast worked.
    assert isinstance(backend, Backend), type(backend)
    assert backend.name() == "tuned", backend.name()
    assert dist.get_backend() == "tuned"
    assert backend.rank() == rank and backend.size() == world_size

    def seq():
        return backend._get_sequence_number_for_group() if hasattr(backend, "_get_sequence_number_for_group") \
            else None

    seq0 = seq()
    t = torch.full((1001,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert work.is_completed() and work.is_success()
    assert isinstance(value, list) and len(value) == 1 and value[0].data_ptr() == t.data_ptr(), value
    assert torch.equal(t, torch.full((1001,), float(sum(range(world_size)))))
    assert work.result()[0].data_ptr() == t.data_ptr()
    seq1 = seq()
    if seq0 is not None:
        assert seq1 == seq0 + 1, (seq0, seq1)
    # Later works carry later sequence numbers (per group), whatever the op.
    dist.broadcast(t, src=0)
    dist.barrier()
    if seq0 is not None:
        assert seq() == seq1 + 2, (seq1, seq())

    # Every op shows up in the profiler under its title.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, src=world_size - 1)
        out = torch.empty(world_size * 1001)
        dist.all_gather_into_tensor(out, t)
        dist.reduce_scatter_tensor(t, out)
        dist.all_reduce(t, async_op=True).wait()
    names = {e.name for e in prof.events()}
    return {"names": sorted(n for n in names if n.startswith("tuned:")), "seq": (seq0, seq1)}


def test_backend_objects_work_and_profiler():
    results = launch(2, _backend_objects)
    for rank, res in enumerate(results):
        for title in ("tuned:all_reduce", "tuned:broadcast", "tuned:all_gather_into_tensor",
                      "tuned:reduce_scatter_tensor"):
            assert title in res["names"], f"rank {rank}: no profiler event {title!r}; got {res['names']}"


def _import_env(**extra) -> dict:
    """The environment for a child interpreter that imports the same tunedist as this test process."""
    import tunedist

    env = dict(os.environ)
    pkg_parent = str(Path(tunedist.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_parent, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def test_import_guards():
    """Two children at once (each pays for importing torch): a torch version mismatch, and TorchComms mode."""
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
    procs = {
        "version": subprocess.Popen([sys.executable, "-c", version_probe], env=_import_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        "torchcomms": subprocess.Popen([sys.executable, "-c", torchcomms_probe],
                                       env=_import_env(TORCH_DISTRIBUTED_USE_TORCHCOMMS="1"),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    }
    outputs = {}
    try:
        for name, p in procs.items():
            outputs[name] = p.communicate(timeout=IMPORT_TIMEOUT_S)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    out = outputs["version"]
    assert "IMPORT_ERROR" in out and "rebuild" in out.lower() and "0.0.1+not-the-build" in out, out
    out = outputs["torchcomms"]
    assert "RUNTIME_ERROR" in out and "TORCH_DISTRIBUTED_USE_TORCHCOMMS" in out, out


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
