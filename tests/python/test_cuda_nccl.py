"""CUDA tensors in a `tuned` group: registration for cpu and cuda, the lazily created NCCL side, and its errors.

Runs everywhere: registration and device mapping (plain "tuned" on a machine without a GPU), what the build reports
about NCCL, and a CPU-only configure (TUNEDIST_USE_NCCL=OFF). With a GPU (and a build with NCCL) also: every
collective on CUDA tensors, a DDP step, futures and stream order, abort and the NCCL log line, and
"cpu:tuned,cuda:nccl" (torch's NCCL backends refuse to be created without a GPU), all at world size 1, because NCCL
refuses two ranks on one GPU. The GPU tests have "cuda" in their names: select them with ``-k cuda``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tunedist
from dist_utils import launch

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = torch.cuda.is_available()
NCCL_IN = tunedist.nccl_compiled_in()
needs_gpu = pytest.mark.skipif(not (HAS_GPU and NCCL_IN),
                               reason="needs a CUDA GPU and a tunedist build with NCCL (TUNEDIST_USE_NCCL=ON)")


# ---------------------------------------------------------------------------------------------------------------
# Without a GPU


def test_registration_devices():
    expected = ["cpu", "cuda"] if NCCL_IN else ["cpu"]
    assert dist.Backend.backend_capability["tuned"] == expected
    # Registering never takes a device's default backend away from torch's own.
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    if "cuda" in dist.Backend.default_device_backend_map:
        assert dist.Backend.default_device_backend_map["cuda"] == "nccl"


def test_build_reports_nccl():
    info = tunedist._C.nccl_build_info()
    assert info["compiled_in"] == NCCL_IN
    expect = os.environ.get("TUNEDIST_EXPECT_NCCL")  # set by benchmarks/gpu_check.sh
    if expect is not None:
        assert NCCL_IN == (expect == "1"), f"TUNEDIST_EXPECT_NCCL={expect} but the build reports {info}"
    if NCCL_IN:
        assert torch.version.cuda is not None
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["header_version"])
        # The headers tunedist compiled against agree with torch's NCCL in major.minor (checked again at run time).
        torch_nccl = ".".join(str(x) for x in torch.cuda.nccl.version()[:2])
        assert info["torch_nccl_version"].startswith(torch_nccl + ".")
        assert info["header_version"].split(".")[:2] == info["torch_nccl_version"].split(".")[:2]
    else:
        assert info["header_version"] == "" and info["torch_nccl_version"] == ""


def test_nccl_creation_log(caplog, monkeypatch):
    """What the backend logs when it creates a group's NCCL side (the hook the C++ side calls; with a GPU,
    test_cuda_all_ops_world1 checks that the hook runs): NCCL's summary, and a warning per finding that is not ok."""
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=tunedist-no-such-if0")
    with caplog.at_level(logging.INFO, logger="tunedist"):
        tunedist._on_nccl_created(0, 4)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(infos) == 1 and "NCCL side created for a group of 4" in infos[0]
    assert any("nccl.async_error_handling" in w for w in warnings), warnings
    assert any("nccl.socket_ifname" in w and "tunedist-no-such-if0" in w for w in warnings), warnings
    # Nothing was changed in the environment: tunedist only reports.
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def _check_plain_tuned(rank: int, world_size: int) -> dict:
    pg = dist.group.WORLD
    cpu_backend = pg._get_backend(torch.device("cpu"))
    same_object = None
    if NCCL_IN:
        cuda_backend = pg._get_backend(torch.device("cuda"))
        same_object = cuda_backend is cpu_backend  # one TunedBackend for both device types
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    dist.barrier()
    if not torch.cuda.is_available():
        # device_ids name CUDA devices; with none usable the barrier stays on the CPU side (no NCCL side below).
        dist.barrier(device_ids=[0])
    objs = [None] * world_size
    dist.all_gather_object(objs, {"rank": rank})
    return {
        "device_types": sorted(d.type for d in pg._device_types),
        "same_object": same_object,
        "sum": t.tolist(),
        "objs": objs,
        # CPU-only use never creates the NCCL side (nor touches CUDA).
        "nccl_side": tunedist._C.nccl_side(cpu_backend),
    }


def test_plain_tuned_maps_both_devices_on_cpu_machine():
    results = launch(2, _check_plain_tuned)
    for r in results:
        assert r["device_types"] == (["cpu", "cuda"] if NCCL_IN else ["cpu"])
        assert r["same_object"] in ((True,) if NCCL_IN else (None,))
        assert r["sum"] == [3.0] * 5
        assert r["objs"] == [{"rank": 0}, {"rank": 1}]
        assert r["nccl_side"] is None


def _check_split_mapping(rank: int, world_size: int) -> dict:
    pg = dist.group.WORLD
    cpu_backend = pg._get_backend(torch.device("cpu"))
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    cuda_backend = pg._get_backend(torch.device("cuda"))
    nccl_classes = tuple(getattr(dist, n) for n in ("ProcessGroupNCCL", "ProcessGroupNCCL2") if hasattr(dist, n))
    return {
        # Only a tunedist backend has a shared-memory reservation; this raises for any other backend.
        "cpu_shm_bytes": tunedist._C.reserved_shm_bytes(cpu_backend),
        "cuda_is_torch_nccl": isinstance(cuda_backend, nccl_classes),
        "sum": t.tolist(),
    }


@pytest.mark.skipif(not (HAS_GPU and dist.is_nccl_available()),
                    reason="torch's ProcessGroupNCCL (and ProcessGroupNCCL2) refuse to be created on a machine without "
                           "a GPU, so \"cpu:tuned,cuda:nccl\" cannot initialise there; plain \"tuned\" can, since it "
                           "creates its NCCL side only at the first CUDA call")
def test_cuda_cpu_tuned_cuda_nccl_still_works():
    for r in launch(1, _check_split_mapping, backend="cpu:tuned,cuda:nccl"):
        assert r["cpu_shm_bytes"] > 0
        assert r["cuda_is_torch_nccl"]
        assert r["sum"] == [0.0] * 3


def test_cpu_only_configure():
    """TUNEDIST_USE_NCCL=OFF configures a build without the NCCL side, and so without the hooks' CUDA kernels
    (configure only; the build itself is what CI's CPU-only job and benchmarks/gpu_check.sh --dry-run exercise)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tunedist-nccl-off-") as build:
        subprocess.run(["cmake", "-S", str(ROOT), "-B", build, "-DTUNEDIST_USE_NCCL=OFF",
                        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                        f"-DPython_EXECUTABLE={sys.executable}"],
                       check=True, capture_output=True, text=True)
        cache = Path(build, "CMakeCache.txt").read_text()
        assert "TUNEDIST_USE_NCCL:BOOL=OFF" in cache
        generated = "".join(p.read_text(errors="replace") for p in Path(build).rglob("*.make"))
        generated += "".join(p.read_text(errors="replace") for p in Path(build).glob("build.ninja"))
        assert "nccl_side.cpp" in generated  # the dispatch is always built ...
        assert "nccl_factory.cpp" not in generated  # ... ProcessGroupNCCL only with NCCL
        assert "TUNEDIST_WITH_NCCL" not in generated
        assert "TUNEDIST_CUDA_KERNELS:BOOL=OFF" in cache  # the hooks' CUDA kernels (test_hooks_cuda.py) ...
        assert "compress_hook.cpp" in generated  # ... not the hooks themselves
        assert "hooks/cuda/kernels.cu" not in generated and "hooks/cuda/dispatch.cpp" not in generated
        assert "TUNEDIST_WITH_CUDA_KERNELS" not in generated


def test_gpu_check_script_dry_run(tmp_path):
    """benchmarks/gpu_check.sh parses, and its CPU-side part (machine description, configure with NCCL forced on)
    runs here and writes its JSON."""
    script = ROOT / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    # No step limits here: this machine may be loaded; the limits matter on the GPU machine.
    env = {**os.environ, "OUT": str(tmp_path / "out"), "TUNEDIST_GPU_BUILD_DIR": str(tmp_path / "build"),
           "PYTHON": sys.executable, "TUNEDIST_GPU_CHECK_BUDGET_S": "100000", "T_ENV": "100000",
           "T_CONFIGURE": "100000"}
    proc = subprocess.run(["bash", str(script), "--dry-run"], env=env, capture_output=True, text=True)
    import json

    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert report["dry_run"] is True
    assert set(steps) == {"env", "configure"}
    assert report["env"]["torch"] == torch.__version__
    if NCCL_IN:  # the configure forces TUNEDIST_USE_NCCL=ON, which needs what this build found
        assert proc.returncode == 0 and report["ok"], proc.stdout + proc.stderr
        assert "NCCL side ON" in steps["configure"]["log_tail"]
    else:
        assert steps["configure"]["rc"] != 0 and "TUNEDIST_USE_NCCL=ON needs" in steps["configure"]["log_tail"]


def _static_libstdcxx_compiler(tmp_path) -> str:
    """A g++ that links libstdc++ statically into shared libraries, as the GPU machine's /opt/gcc/bin/g++ did."""
    gxx = shutil.which("g++")
    if gxx is None or shutil.which("cmake") is None:
        pytest.skip("needs g++ and cmake")
    wrapper = tmp_path / "static-g++"
    wrapper.write_text(f'#!/bin/sh\nexec {gxx} "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    probe = tmp_path / "probe.cpp"
    probe.write_text("#include <sstream>\nint f(unsigned long v) { std::ostringstream s; s << v; return 0; }\n")
    if subprocess.run([str(wrapper), "-fPIC", "-shared", str(probe), "-o", str(tmp_path / "p.so")]).returncode:
        pytest.skip("this g++ has no static libstdc++ to link")
    return str(wrapper)


def test_static_libstdcxx_compiler_refused(tmp_path):
    """A compiler that would copy libstdc++ into libtunedist (two libstdc++ beside torch's: a crash at import, seen
    on the GPU machine) is refused at configure, with the fix in the message."""
    env = {**os.environ, "CXX": _static_libstdcxx_compiler(tmp_path)}
    proc = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
                           f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                           f"-DPython_EXECUTABLE={sys.executable}"], env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "links libstdc++ statically" in out and "CXX=/usr/bin/g++" in out, out
    # The same configure with the plain compiler passes the check (the rest of the configure is other tests' work).
    ok = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build-ok"), "-DTUNEDIST_USE_NCCL=OFF",
                         f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                         f"-DPython_EXECUTABLE={sys.executable}"], capture_output=True, text=True)
    assert ok.returncode == 0 and "statically" not in ok.stdout + ok.stderr, ok.stdout + ok.stderr


def test_gpu_check_falls_back_to_the_system_compiler(tmp_path):
    """benchmarks/gpu_check.sh, given a default compiler that links libstdc++ statically, configures again with
    /usr/bin/g++ instead of building a library that crashes at import."""
    if not (os.access("/usr/bin/g++", os.X_OK) and os.access("/usr/bin/gcc", os.X_OK)):
        pytest.skip("no /usr/bin/g++ to fall back to")
    env = {**os.environ, "CXX": _static_libstdcxx_compiler(tmp_path), "OUT": str(tmp_path / "out"),
           "TUNEDIST_GPU_BUILD_DIR": str(tmp_path / "build"), "PYTHON": sys.executable,
           "TUNEDIST_GPU_CHECK_BUDGET_S": "100000", "T_ENV": "100000", "T_CONFIGURE": "100000"}
    subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env, capture_output=True,
                   text=True)
    import json

    steps = {s["step"]: s for s in json.loads((tmp_path / "out" / "gpu_check.json").read_text())["steps"]}
    log = (tmp_path / "out" / "configure.log").read_text()
    assert "links libstdc++ statically" in log and "retrying configure with the system compiler" in log, log
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert "CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/g++" in cache or "CMAKE_CXX_COMPILER:STRING=/usr/bin/g++" in cache
    if NCCL_IN:  # the dry run forces the NCCL side on, which needs what this build found
        assert steps["configure"]["rc"] == 0, log


# ---------------------------------------------------------------------------------------------------------------
# With a GPU: world size 1 (NCCL refuses two ranks on one GPU)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _cuda_all_ops(rank: int, world_size: int) -> dict:
    records = _Records()
    logging.getLogger("tunedist").addHandler(records)
    logging.getLogger("tunedist").setLevel(logging.INFO)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    pg = dist.group.WORLD
    backend = pg._get_backend(dev)
    before = tunedist._C.nccl_side(backend)
    out = {}
    x = torch.arange(8, dtype=torch.float32, device=dev)
    t = x.clone()
    dist.all_reduce(t)
    out["all_reduce"] = torch.equal(t, x)
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = torch.equal(t, x)
    t = x.clone()
    dist.broadcast(t, src=0)
    out["broadcast"] = torch.equal(t, x)
    t = x.clone()
    dist.reduce(t, dst=0)
    out["reduce"] = torch.equal(t, x)
    lst = [torch.empty_like(x)]
    dist.all_gather(lst, x)
    out["all_gather"] = torch.equal(lst[0], x)
    big = torch.empty(8, device=dev)
    dist.all_gather_into_tensor(big, x)
    out["all_gather_into_tensor"] = torch.equal(big, x)
    small = torch.empty(8, device=dev)
    dist.reduce_scatter_tensor(small, x)
    out["reduce_scatter_tensor"] = torch.equal(small, x)
    a2a = torch.empty(8, device=dev)
    dist.all_to_all_single(a2a, x)
    out["all_to_all_single"] = torch.equal(a2a, x)
    half = x.half()
    dist.all_reduce(half)
    out["all_reduce_half"] = torch.equal(half, x.half())
    dist.barrier(device_ids=[0])
    # A coalesced block of CUDA calls goes to ProcessGroupNCCL as one group.
    c1, c2 = x.clone(), x.clone() * 2
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_reduce(c1)
        dist.all_reduce(c2)
    cm.wait()
    out["coalesced"] = torch.equal(c1, x) and torch.equal(c2, x * 2)
    # Futures and stream order: the input is written by a kernel on the current stream right before the call, and
    # the result is read on the current stream after wait(), with no explicit synchronize in between.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.ones(1 << 20, device=dev).mul_(3)
        work = dist.all_reduce(y, async_op=True)
        fut = work.get_future()
        work.wait()
        z = y * 2
    torch.cuda.current_stream().wait_stream(s)  # z is read on the default stream below
    result = fut.wait()
    out["future"] = torch.equal(result[0].cpu(), torch.full((1 << 20,), 3.0))
    out["stream_order"] = bool((z == 6).all().item())
    # tunedist.all_reduce (the operator) on a CUDA tensor goes to the NCCL side and waits as dist.all_reduce does:
    # written by a kernel right before, read by one right after, on the current stream.
    d = torch.ones(1 << 16, device=dev).mul_(5)
    tunedist.all_reduce(d, dist.ReduceOp.MAX)
    out["direct_op"] = bool((d.add(1) == 6).all().item())
    # Mixed devices are refused by name.
    try:
        dist.all_gather([torch.empty(8)], x)
        out["mixed_error"] = None
    except RuntimeError as e:
        out["mixed_error"] = str(e)
    nccl = tunedist._C.nccl_side(backend)
    out["nccl_before"] = before
    # The backend torch itself makes for "nccl": nccl2 on torch 2.15 unless TORCH_DIST_USE_NCCL2=0.
    plugin = tunedist.nccl_creator()
    want = "ProcessGroupNCCL2" if plugin is not None and "nccl2" in plugin.creator_fn.__name__ else "ProcessGroupNCCL"
    out["nccl_is_pg_nccl"] = type(nccl).__name__ == want
    out["log"] = records.messages
    return out


@needs_gpu
def test_cuda_all_ops_world1():
    (r,) = launch(1, _cuda_all_ops)
    for key in ("all_reduce", "all_reduce_max", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                "reduce_scatter_tensor", "all_to_all_single", "all_reduce_half", "coalesced", "future",
                "stream_order", "direct_op"):
        assert r[key] is True, (key, r)
    assert r["nccl_before"] is None and r["nccl_is_pg_nccl"]
    assert r["mixed_error"] is not None and "mixes CPU and CUDA" in r["mixed_error"]
    assert "all_gather" in r["mixed_error"] and "rank 0" in r["mixed_error"]
    assert any("NCCL side created" in m for m in r["log"]), r["log"]


def _cuda_barrier_first(rank: int, world_size: int) -> dict:
    torch.cuda.set_device(0)
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    before = tunedist._C.nccl_side(backend)
    # torch's barrier op passes only device_ids to the backend (it drops the device dist.barrier() set): tuned must
    # still send it to its NCCL side, as torch's "nccl" would run it.
    dist.barrier(device_ids=[0])
    return {"before": before is None, "after": tunedist._C.nccl_side(backend) is not None}


@needs_gpu
def test_cuda_barrier_with_device_ids_goes_to_nccl():
    (r,) = launch(1, _cuda_barrier_first)
    assert r == {"before": True, "after": True}, r


def _cuda_ddp_step(rank: int, world_size: int) -> dict:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    reference = [p.detach().clone() for p in model.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.randn(16, 32, device=dev)
    ddp(data).square().mean().backward()
    opt.step()
    # The same step without DDP, from the same start: at world size 1 the averaged gradients are the local ones.
    ref_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    with torch.no_grad():
        for p, q in zip(ref_model.parameters(), reference):
            p.copy_(q)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    ref_model(data).square().mean().backward()
    ref_opt.step()
    diffs = [float((p - q).abs().max()) for p, q in zip(model.parameters(), ref_model.parameters())]
    return {"max_diff": max(diffs), "moved": any(not torch.equal(p, q) for p, q in zip(model.parameters(), reference))}


@needs_gpu
def test_cuda_ddp_step_world1():
    (r,) = launch(1, _cuda_ddp_step)
    assert r["moved"]
    assert r["max_diff"] <= 1e-6, r


def _cuda_abort(rank: int, world_size: int) -> dict:
    dev = torch.device("cuda", 0)
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    backend = dist.group.WORLD._get_backend(dev)
    backend.abort()
    errors = {}
    for name, call in (("cuda", lambda: dist.all_reduce(torch.ones(4, device=dev))),
                       ("cpu", lambda: dist.all_reduce(torch.ones(4)))):
        try:
            call()
            torch.cuda.synchronize()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            errors[name] = f"{type(e).__name__}: {e}"
    return errors


@needs_gpu
def test_cuda_abort_world1():
    (r,) = launch(1, _cuda_abort)
    assert r["cuda"] is not None and "aborted" in r["cuda"], r
    assert r["cpu"] is not None and "aborted" in r["cpu"], r
