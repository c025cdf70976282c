"""The hooks on CUDA tensors, and the CUDA kernels behind them (csrc/hooks/cuda: fused fp16/bf16 compression and
PowerSGD's fused error feedback).

Runs everywhere: the build has the kernels wherever nvcc and the NCCL side are there (CMake's default; a configure
without the NCCL side leaves them out: test_cuda_nccl.py::test_cpu_only_configure), and forcing them on without the
NCCL side is a clear configure error. With a GPU: the fused compression against torch's CUDA
``src.to(dtype).div_(d)`` bit for bit (aligned and unaligned tensors, sizes with and without a vector tail, overflow
to inf), checked to run as one kernel; and every hook variant of the CPU parity test (hooks_workers.py) in DDP on
CUDA at world size 1 (NCCL refuses two ranks on one GPU), torch's hook against our drop-in and native ones, on the
default `tuned` group (its NCCL side). GPU tests have "cuda" in their names (benchmarks/gpu_check.sh runs them with
``-k cuda``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import tunedist
import tunedist.hooks
from dist_utils import launch
from tunedist._C import _hooks

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = torch.cuda.is_available()
NCCL_IN = tunedist.nccl_compiled_in()
needs_gpu = pytest.mark.skipif(not (HAS_GPU and NCCL_IN),
                               reason="needs a CUDA GPU and a tunedist build with NCCL (TUNEDIST_USE_NCCL=ON)")


def _nvcc() -> str | None:
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if found is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = "/usr/local/cuda/bin/nvcc"
    return found


# ---------------------------------------------------------------------------------------------------------------
# Without a GPU


def test_build_has_the_cuda_kernels_where_nvcc_is():
    built = _hooks.cuda_kernels_built()
    expect = os.environ.get("TUNEDIST_EXPECT_CUDA_KERNELS")  # set by benchmarks/gpu_check.sh
    if expect is not None:
        assert built == (expect == "1"), f"TUNEDIST_EXPECT_CUDA_KERNELS={expect} but the build has them: {built}"
    else:
        assert built == bool(NCCL_IN and _nvcc()), (
            f"nvcc {_nvcc()}, NCCL side {NCCL_IN}, kernels built {built}: CMake's default builds the kernels "
            "exactly when both are there")
    assert tunedist.hooks.cuda_kernels_built() == built


def test_forcing_the_cuda_kernels_without_nccl_is_a_clear_configure_error():
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    with tempfile.TemporaryDirectory(prefix="tunedist-cuda-kernels-bad-") as build:
        run = subprocess.run(["cmake", "-S", str(ROOT), "-B", build, "-DTUNEDIST_USE_NCCL=OFF",
                              "-DTUNEDIST_CUDA_KERNELS=ON", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                              f"-DPython_EXECUTABLE={sys.executable}"], capture_output=True, text=True)
        assert run.returncode != 0
        assert "TUNEDIST_CUDA_KERNELS=ON needs the NCCL side" in run.stderr


# ---------------------------------------------------------------------------------------------------------------
# With a GPU: the compression kernel


def _kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("divisor", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [0, 1, 3, 4, 1001, (1 << 20) + 3])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_cuda_compress_matches_torch_bit_for_bit(dtype, divisor, n, offset):
    gen = torch.Generator(device="cuda").manual_seed(n + divisor)
    base = torch.randn(n + offset, device="cuda", generator=gen) * 3.0
    if n >= 8:  # overflow to inf, the largest finite values, subnormals and zeros
        base[offset:offset + 8] = torch.tensor([7e4, -7e4, 65504.0, 3e38, 1e-7, -1e-9, 0.0, -0.0], device="cuda")
    src = base[offset:]
    ref = src.to(dtype).div_(divisor)
    dst = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
    _hooks.compress_into(dst, src, divisor)
    assert torch.equal(_bits(dst), _bits(ref))


@needs_gpu
def test_cuda_compress_is_one_fused_kernel():
    if not _hooks.cuda_kernels_built():
        pytest.skip("this build has no CUDA kernels (TUNEDIST_CUDA_KERNELS=OFF)")
    src = torch.randn(1 << 20, device="cuda")
    dst = torch.empty(1 << 20, device="cuda", dtype=torch.float16)
    # torch's own two-op sequence, for contrast: a cast kernel and a multiply kernel. Where the profiler sees no
    # CUDA kernel at all (no CUPTI, e.g. some sandboxes) this test cannot tell one kernel from two.
    torch_names = _kernel_names(lambda: src.to(torch.float16).div_(2))
    if not torch_names:
        pytest.skip("the profiler records no CUDA kernels on this machine (CUPTI unavailable)")
    assert len(torch_names) == 2, torch_names
    names = _kernel_names(lambda: _hooks.compress_into(dst, src, 2))
    assert len(names) == 1 and "compress" in names[0], names


# ---------------------------------------------------------------------------------------------------------------
# With a GPU: every hook in DDP at world size 1


def _train_cuda(install, steps: int = 12):
    from hooks_workers import MixedNet, batch

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = MixedNet().to(dev)
    ddp = DDP(model, device_ids=[0])
    state = install(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batch(0, step)
        opt.zero_grad()
        F.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
        opt.step()
    torch.cuda.synchronize()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, state


def _cuda_parity_worker(rank: int, world_size: int) -> dict:
    import traceback

    from hooks_workers import _stats, _variants

    group = dist.group.WORLD
    results = {}
    for name, (ref_install, dropin_install, native_install) in _variants().items():
        try:
            entry = {}
            for label, install in [("torch", ref_install), ("dropin", dropin_install), ("native", native_install)]:
                params, state = _train_cuda(lambda ddp, i=install: i(ddp, group))
                entry[label] = {"params": params, "stats": _stats(state)}
            results[name] = entry
        except Exception:  # noqa: BLE001 - reported per variant
            results[name] = traceback.format_exc()
    # The fused error feedback runs in PowerSGD's steps (error feedback on, from the second compressed step).
    if _hooks.cuda_kernels_built():
        from hooks_workers import _variants as variants

        native = variants()["powersgd_r2_cold_batch"][2]
        from torch.profiler import ProfilerActivity, profile

        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                _train_cuda(lambda ddp: native(ddp, group), steps=5)
            results["_kernels"] = sorted({e.name for e in prof.events()
                                          if e.device_type == torch.autograd.DeviceType.CUDA})
        except Exception:  # noqa: BLE001 - a profiler failure must not lose the parity results above
            results["_kernels"] = traceback.format_exc()
    return results


@needs_gpu
def test_cuda_hooks_match_torch_world1():
    (runs,) = launch(1, _cuda_parity_worker, timeout_s=600.0)
    kernels = runs.pop("_kernels", None)
    for name, entry in runs.items():
        assert not isinstance(entry, str), f"{name} failed:\n{entry}"
        ref = entry["torch"]["params"]
        for label in ("dropin", "native"):
            for key, value in ref.items():
                got = entry[label]["params"][key]
                if name.startswith(("powersgd", "batched")):
                    torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-5,
                                               msg=lambda m, k=key, lb=label, n=name: f"{n}, {lb}, {k}: {m}")
                else:  # allreduce, fp16, bf16 and the fp16 wrappers: torch's CUDA arithmetic bit for bit
                    assert torch.equal(got, value), f"{name}, {label}, {key}: max diff {(got - value).abs().max()}"
        if name.startswith(("powersgd", "batched", "fp16_wrapper_powersgd")):
            stats = entry["torch"]["stats"]
            assert stats[1] > 0 and stats[2] > 0, (name, stats)
            for label in ("dropin", "native"):
                assert entry[label]["stats"] == stats, (name, label, entry[label]["stats"], stats)
    # Checked after the parity above, so a profiler problem cannot hide it: the fused error-feedback kernel ran.
    assert not isinstance(kernels, str), f"profiling the native PowerSGD run failed:\n{kernels}"
    if kernels == []:  # the profiler recorded no CUDA kernel at all here (no CUPTI): nothing to check it against
        import warnings

        warnings.warn("the profiler records no CUDA kernels here: the fused error feedback was not observed",
                      stacklevel=1)
    elif kernels is not None:
        assert any("addAndRemember" in k for k in kernels), kernels
