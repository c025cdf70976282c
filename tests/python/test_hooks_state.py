"""Hook state, edge cases and what reaches the process group (real processes, gloo and ``tuned``).

* ``state_dict`` round trip: 10 steps, save, new processes restore, 10 more steps == 20 steps straight; likewise
  through ``pickle`` (torch's format: the process group is dropped and comes back as the default group).
* fp16/bf16 hooks hand the process group half-precision tensors of the bucket's length, and the native hook reuses
  its buffers (at most one fp32 bucket's bytes in all).
* Edge cases against torch's hook: 1-D-only models, tensors smaller than the rank (QR at r = 3), bucket rebuild
  with several buckets, DDP options (bucket views, unused parameters, static graph, no_sync) and a GradScaler;
  empty buckets (torch's PowerSGD cannot run them) against DDP without a hook.
* Errors: a second registration, a drop-in PowerSGD hook without a state, a group that lacks the dtype.
"""

from __future__ import annotations

import functools

import pytest
import torch

import hooks_state_workers as w
from dist_utils import launch

LAUNCH_TIMEOUT_S = 300.0


@functools.cache
def _resume_runs():
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tunedist_hooks_resume_") as directory:
        straight = launch(2, w.resume_first_half, directory, timeout_s=LAUNCH_TIMEOUT_S)
        resumed = launch(2, w.resume_second_half, directory, timeout_s=LAUNCH_TIMEOUT_S)
    return straight, resumed


@pytest.mark.parametrize("how,warm", w.RESUME_CONFIGS, ids=[f"{h}-{'warm' if x else 'cold'}" for h, x in
                                                             w.RESUME_CONFIGS])
def test_resumed_run_equals_uninterrupted(how, warm):
    straight, resumed = _resume_runs()
    for rank in range(2):
        a, b = straight[rank][(how, warm)], resumed[rank][(how, warm)]
        assert b["iter"] == a["iter"] == 20
        for key, value in a["params"].items():
            got = b["params"][key]
            assert torch.equal(got, value), f"rank {rank}, {key}: max diff {(got - value).abs().max().item():.3g}"


def test_pickle_format_is_torchs():
    runs = launch(1, w.pickle_format_worker, backend="gloo", timeout_s=LAUNCH_TIMEOUT_S)
    report = runs[0]
    assert report["keys_ours"] == report["keys_torch"]
    assert report["torch_to_ours_iter"] == 7 and report["ours_to_torch_iter"] == 7
    assert report["rng_draws_equal"]
    assert report["group_restored"]


@functools.cache
def _edge_runs():
    try:
        return launch(2, w.edge_worker, timeout_s=LAUNCH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize("case", w.EDGE_CASES)
def test_edge_case_matches_reference(case):
    runs = _edge_runs()
    if isinstance(runs, Exception):
        raise runs
    for rank, per_rank in enumerate(runs):
        entry = per_rank[case]
        assert not isinstance(entry, str), f"rank {rank} failed:\n{entry}"
        assert entry["checked"] > 0
        for key, value in entry["reference"].items():
            for label in ("dropin", "native"):
                got = entry[label][key]
                assert torch.isfinite(got).all(), f"{label}, rank {rank}, {key}: not finite"
                torch.testing.assert_close(got, value, rtol=entry["rtol"], atol=entry["atol"],
                                           msg=lambda m, k=key, lb=label, r=rank: f"{lb}, rank {r}, {k}: {m}")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_compressed_hooks_send_half_bytes(precision):
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    for rank, report in enumerate(launch(2, w.half_bytes_worker, precision, backend="gloo",
                                         timeout_s=LAUNCH_TIMEOUT_S)):
        for label in ("dropin", "native"):
            calls = report[label]["calls"]
            assert {c[0] for c in calls} == {dtype}, f"rank {rank}: {label}: dtypes {set(c[0] for c in calls)}"
            # Every gradient element travelled, once per step, in the low precision.
            assert sum(c[1] for c in calls) == report["steps"] * report["param_numel"], (label, calls)
            assert len(calls) > report["steps"], f"{label}: expected several buckets per step"
        native = report["native"]
        # No extra memory: CPU float32 buckets are compressed in place, so every low-precision tensor lies in a
        # storage of exactly its fp32 bucket's size (the bucket's own), and those are reused from step to step.
        # (Summing distinct storage addresses instead would measure where the allocator put DDP's buckets.)
        assert all(c[3] == 4 * c[1] for c in native["calls"]), native
        assert native["distinct_storages"] < len(native["calls"]), "the native hook did not reuse its buffers"


def test_errors_are_clear():
    report = launch(2, w.errors_worker, backend="gloo", timeout_s=LAUNCH_TIMEOUT_S)[0]
    assert "already has the native hook 'powersgd'" in report["second_register"]
    assert "already has a hook from register_comm_hook" in report["register_after_python_hook"]
    assert "the hook state is None" in report["dropin_state_none"]
    assert "cannot allreduce torch.bfloat16" in report["missing_dtype"] and "rank 0" in report["missing_dtype"]
    assert "start_powerSGD_iter" in report["bad_start_iter"]
    assert "unknown hook" in report["unknown_hook"]


def test_state_attributes_like_torch():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

    from tunedist.hooks import powerSGD

    ours, ref = powerSGD.PowerSGDState(None), torch_psgd.PowerSGDState(None)
    for name in ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate", "use_error_feedback",
                 "warm_start", "orthogonalization_epsilon", "batch_tensors_with_same_shape", "iter",
                 "compression_stats_logging_frequency", "next_stats_report", "error_dict"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert ours.compression_stats() == ref.compression_stats()
    assert ours.rng.randint(1_000_000_000) == ref.rng.randint(1_000_000_000)
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        powerSGD.PowerSGDState(None, start_powerSGD_iter=1)
    assert ours.rng.get_state()[2] == ref.rng.get_state()[2] - 1 == 623 or ours.rng.get_state()[2] == 624
