"""``tuned`` without ``import tunedist``: torch finds it through the ``torch.distributed.backends`` entry point, as a
user's script under torchrun would; and TorchComms mode, which lets plugin backends fall through on this torch: with
TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 and the torchcomms package absent (torch then ignores the variable) or importable
(tests/python/standins/torchcomms: the names torch imports from it; torch's own code then routes each group).

Each torchrun test starts a real torchrun with a script that never imports tunedist; each rank writes its findings to a
file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import free_port

TORCHRUN_TIMEOUT_S = 300  # a hang guard for the child job, not a measurement
HAS_ENTRY_POINT_LOOKUP = hasattr(dist.Backend, "_ensure_backend_registered")
needs_lookup = pytest.mark.skipif(not HAS_ENTRY_POINT_LOOKUP,
                                  reason="this torch does not look backends up in torch.distributed.backends")

# The user's script: no import of tunedist anywhere. Each rank writes its findings as JSON into the folder in argv[2].
_SCRIPT = textwrap.dedent('''
    import json, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist

    mode = sys.argv[1]
    # torch 2.15's "nccl" (nccl2) needs a GPU at init: without one, the device string names the CPU only, which takes
    # the same per-pair lookup
    pairs = "cpu:tuned,cuda:nccl" if torch.cuda.is_available() else "cpu:tuned"
    backend = pairs if mode == "device-string" else "tuned"
    before = "tunedist" in sys.modules
    dist.init_process_group(backend)
    rank, w = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "imported_before_init": before, "imported_after_init": "tunedist" in sys.modules,
           "torchcomms_on": dist.distributed_c10d._use_torchcomms_enabled(),
           "backend": dist.get_backend(), "cpu_backend": dist.group.WORLD._get_backend(torch.device("cpu")).name()}
    t = torch.full((1001,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce"] = t.unique().tolist()
    sub = dist.new_group(backend="tuned")
    u = torch.full((7,), float(rank + 1))
    dist.all_reduce(u, group=sub, op=dist.ReduceOp.MAX)
    out["new_group"] = [dist.get_backend(sub), u.unique().tolist()]
    # gather: non-destination ranks pass no list (torch hands the backend [] or, with TorchComms on, [[]])
    g = [torch.empty(3) for _ in range(w)] if rank == 0 else None
    dist.gather(torch.full((3,), float(rank)), g, dst=0)
    out["gather"] = [x[0].item() for x in g] if g is not None else None
    if mode == "torchcomms":
        # what torch passes a plugin's gather on a non-destination rank when TorchComms is on: [[]]
        opts = dist.GatherOptions()
        opts.rootRank = 0
        outs = [[torch.empty(2) for _ in range(w)]] if rank == 0 else [[]]
        dist.group.WORLD.gather(outs, [torch.full((2,), float(10 + rank))], opts).wait()
        out["gather_nested_empty"] = [x[0].item() for x in outs[0]] if rank == 0 else None
        # DeviceMesh takes split_group when TorchComms is on and an accelerator is there; split_group itself here
        split = dist.split_group(split_ranks=[[r] for r in range(w)], timeout=timedelta(seconds=120))
        s = torch.full((4,), float(rank + 1))
        dist.all_reduce(s, group=split)
        out["split"] = [dist.get_backend(split), split.size(), s.unique().tolist()]
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (w,), mesh_dim_names=("dp",))
        m = torch.ones(5)
        dist.all_reduce(m, group=mesh.get_group("dp"))
        out["mesh"] = [dist.get_backend(mesh.get_group("dp")), m.unique().tolist()]
    # with TorchComms on, destroy_process_group finalizes what split_group listed as TorchComms communicators
    dist.destroy_process_group()
    with open(f"{sys.argv[2]}/rank{rank}.json", "w") as f:  # a file per rank: lines on a shared stdout interleave
        json.dump(out, f)
''')


def _torchrun(tmp_path, mode: str, nproc: int = 2, **env) -> list[dict]:
    script = tmp_path / "user_script.py"
    script.write_text(_SCRIPT)
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), mode, str(out_dir)],
                          env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TORCHRUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout
    files = sorted(out_dir.glob("rank*.json"))
    assert len(files) == nproc, proc.stdout
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])


def _check_common(results: list[dict], backend: str) -> None:
    w = len(results)
    for r in results:
        assert not r["imported_before_init"] and r["imported_after_init"], r
        assert r["backend"] == backend and r["cpu_backend"] == "tuned", r
        assert r["all_reduce"] == [w * (w + 1) / 2], r
        assert r["new_group"] == ["tuned", [float(w)]], r
    assert results[0]["gather"] == [float(p) for p in range(w)]
    assert all(r["gather"] is None for r in results[1:])


def test_the_installed_distribution_declares_the_entry_point():
    found = {ep.name: ep.value for ep in entry_points(group="torch.distributed.backends")}
    assert found.get("tuned") == "tunedist:register_backend", (
        f"no 'tuned' entry point for {sys.executable} ({found}); install tunedist with pip (pip install "
        "--no-build-isolation .), which writes the entry point into this interpreter's site-packages")


@needs_lookup
def test_torchrun_script_without_import(tmp_path):
    _check_common(_torchrun(tmp_path, "plain"), "tuned")


@needs_lookup
def test_torchrun_script_with_a_device_string(tmp_path):
    _check_common(_torchrun(tmp_path, "device-string"),
                  "cpu:tuned,cuda:nccl" if torch.cuda.is_available() else "cpu:tuned")


STANDINS = Path(__file__).resolve().parent / "standins"


@needs_lookup
@pytest.mark.parametrize("importable", [False, True], ids=["torchcomms-absent", "torchcomms-importable"])
def test_torchrun_script_with_torchcomms_variable(tmp_path, importable):
    env = {"TORCH_DISTRIBUTED_USE_TORCHCOMMS": "1"}
    if importable:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STANDINS), os.environ.get("PYTHONPATH")]))
    results = _torchrun(tmp_path, "torchcomms", **env)
    _check_common(results, "tuned")
    w = len(results)
    assert results[0]["gather_nested_empty"] == [10.0 + p for p in range(w)]
    for r in results:
        # importable: torch's TorchComms mode is on, and gather's [[]], split_group's get_comm() and the
        # finalize at destroy_process_group all reached the `tuned` groups; absent: torch ignored the variable
        assert r["torchcomms_on"] is importable, r
        assert r["split"] == ["tuned", 1, [float(r["rank"] + 1)]], r
        assert r["mesh"] == ["tuned", [float(w)]], r


_LOOKUP_PROBE = textwrap.dedent('''
    import sys
    import torch.distributed as dist
    dist.Backend._ensure_backend_registered("TUNED")
    assert "tunedist" in sys.modules and "TUNED" in dist.Backend._plugins
    import tunedist
    tunedist.register_backend()
    dist.Backend._ensure_backend_registered("tuned")
    assert dist.Backend.backend_list.count("tuned") == 1
    print("REGISTERED_ONCE", dist.Backend.backend_capability["tuned"])
''')


@needs_lookup
def test_lookup_then_import_registers_once():
    out = subprocess.run([sys.executable, "-c", _LOOKUP_PROBE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=TORCHRUN_TIMEOUT_S).stdout
    assert "REGISTERED_ONCE" in out, out


class _TorchComms:
    """The c10d attributes tunedist reads to decide whether TorchComms would bypass it, set as the torch at hand
    would have them: on this torch with the torchcomms package importable and the switch on, or on a torch whose
    TorchComms switch sends every group through TorchComms."""

    def __init__(self, monkeypatch):
        self.c10d = dist.distributed_c10d
        self.mp = monkeypatch

    def importable_with_switch_on(self):
        self.mp.setattr(self.c10d, "_TORCHCOMM_AVAILABLE", True)
        self.mp.setattr(self.c10d, "_torchcomms_is_backend_built", lambda b: b in ("nccl", "gloo"))
        self.mp.setattr(self.c10d, "_torchcomms_is_backend_registered", lambda b: False)
        self.mp.setattr(self.c10d.dist_config, "use_torchcomms", True)

    def without_per_name_test(self, enabled: bool):
        self.mp.delattr(self.c10d, "_torchcomms_handles_backend", raising=False)
        self.mp.setattr(self.c10d, "_use_torchcomms_enabled", lambda: enabled, raising=False)


@pytest.mark.skipif(not hasattr(dist.distributed_c10d, "_torchcomms_handles_backend"),
                    reason="this torch has no per-name TorchComms test")
def test_torchcomms_importable_lets_tuned_fall_through(monkeypatch):
    import tunedist

    tc = _TorchComms(monkeypatch)
    tc.importable_with_switch_on()
    # the switch is live for the names TorchComms owns, and tuned is not one of them
    assert tc.c10d._use_torchcomms_enabled() and tc.c10d._torchcomms_handles_backend("nccl")
    assert not tc.c10d._torchcomms_handles_backend("tuned")
    assert not tc.c10d._torchcomms_handles_backend("cpu:tuned,cuda:nccl")
    assert not tunedist._torchcomms_bypasses_plugins()
    tunedist.register_backend()


def test_torchcomms_refused_only_where_torch_bypasses_plugins(monkeypatch):
    import tunedist

    tc = _TorchComms(monkeypatch)
    tc.without_per_name_test(enabled=False)
    assert not tunedist._torchcomms_bypasses_plugins()  # switch off or torchcomms not importable: torch ignores it
    tc.without_per_name_test(enabled=True)
    assert tunedist._torchcomms_bypasses_plugins()
    with pytest.raises(RuntimeError, match="TORCH_DISTRIBUTED_USE_TORCHCOMMS is set"):
        tunedist.register_backend()
    monkeypatch.delattr(tc.c10d, "_use_torchcomms_enabled")
    assert not tunedist._torchcomms_bypasses_plugins()  # a c10d without TorchComms at all
