"""tunedist's C++ hooks give torch's results: 20 DDP steps on 2 and 3 ranks, for every hook, drop-in
(``ddp.register_comm_hook(state, tunedist.hooks.<module>.<hook>)``) and native (``tunedist.hooks.register``).

Torch's hook and ours run on the same gloo group, so the parameters must be equal bit for bit, except where
float32 PowerSGD runs our own low-rank kernels, which round differently from BLAS (float tolerance; the drop-in
and native hooks still agree bit for bit); the native hook also runs on the ``tuned`` group, whose reduction order
may differ from gloo's at 3 ranks (float tolerance).
PowerSGD runs from step 2 on a model mixing compressed and uncompressed tensors, at ranks 1-2 (Gram-Schmidt) and
4 (QR), warm start and batching on and off, and its compression statistics must be non-zero and equal to torch's.
Batched PowerSGD is compared with torch's algorithm corrected to orthogonalise 3-D views (hooks_workers.py),
since torch's own raises on its first compressed step.
"""

from __future__ import annotations

import functools

import pytest
import torch

from dist_utils import launch
from hooks_workers import VARIANTS, parity_worker

LAUNCH_TIMEOUT_S = 600.0


@functools.cache
def _runs(world_size: int):
    try:
        return launch(world_size, parity_worker, VARIANTS, timeout_s=LAUNCH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - cached so every variant reports it without relaunching
        return exc


def _own_kernels(name: str) -> bool:
    # float32 PowerSGD on CPU runs our low-rank kernels (FMA, their own summation order): float tolerance against
    # torch's BLAS. The fp16 wrapper's PowerSGD runs on fp16 tensors, through ATen as torch's: bit for bit.
    return name.startswith(("powersgd", "batched"))


def _tolerance(name: str) -> dict:
    # fp16/bf16 results differ by a rounding of the half-precision sum when the reduction order differs.
    if "bf16" in name:
        return {"rtol": 2e-2, "atol": 2e-3}
    if "fp16" in name:
        return {"rtol": 2e-3, "atol": 2e-4}
    return {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("world_size", [2, 3], ids=lambda n: f"ws{n}")
def test_hook_matches_torch(world_size, variant):
    runs = _runs(world_size)
    if isinstance(runs, Exception):
        raise runs
    for rank, per_rank in enumerate(runs):
        entry = per_rank[variant]
        assert not isinstance(entry, str), f"rank {rank} failed:\n{entry}"
        ref = entry["torch"]["params"]
        for label in ("dropin", "native"):
            for key, value in ref.items():
                got = entry[label]["params"][key]
                if _own_kernels(variant):
                    torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-5,
                                               msg=lambda m, k=key, lb=label, r=rank: f"{lb}, rank {r}, {k}: {m}")
                else:
                    assert torch.equal(got, value), (
                        f"{label}, rank {rank}, {key}: max diff {(got - value).abs().max().item():.3g}")
        # The drop-in hook and the native one run the same C++ code on the same group: the same bits.
        for key, value in entry["dropin"]["params"].items():
            assert torch.equal(entry["native"]["params"][key], value), f"native vs drop-in, rank {rank}, {key}"
        for key, value in ref.items():
            torch.testing.assert_close(entry["native_tuned"]["params"][key], value, **_tolerance(variant),
                                       msg=lambda m, k=key, r=rank: f"native on tuned, rank {r}, {k}: {m}")
        rank0 = runs[0][variant]["torch"]["params"]
        assert all(torch.equal(rank0[k], ref[k]) for k in ref), f"rank {rank} and rank 0 disagree"
        if variant.startswith(("powersgd", "batched", "fp16_wrapper_powersgd")):
            stats = entry["torch"]["stats"]
            assert stats[1] > 0 and stats[2] > 0 and stats[0] > 1, stats
            for label in ("dropin", "native", "native_tuned"):
                assert entry[label]["stats"] == pytest.approx(stats), label
