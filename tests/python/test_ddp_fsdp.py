"""DDP and FSDP2 end to end on the ``tuned`` backend (CPU tensors, real processes).

* DDP reaches the same parameters and buffers as on gloo, in the variants that change what DDP asks of the process
  group (bucket views, unused-parameter search, static graph), for world sizes 2 and 3.
* DDP overlaps communication with the backward pass: a gradient bucket's all-reduce runs while autograd is still
  computing earlier layers' gradients.
* FSDP2 (``fully_shard`` on an explicit CPU mesh) matches a single-process emulation of the same training for the
  reductions it uses: AVG (fp32 default), PREMUL_SUM (custom gradient divide factor) and bf16 mixed precision with
  fp32 reduction, with and without resharding after forward.

Each world size runs its variants in one launch (spawning ranks costs more than training the small models), and
the parametrized tests read their variant's result from it.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_utils import launch

DDP_STEPS = 20
FSDP_STEPS = 6
LAUNCH_TIMEOUT_S = 180.0

# DDP keyword arguments per variant; "find_unused" also gives the model a layer that forward never uses.
DDP_VARIANTS = {
    "default": {},
    "grad_as_bucket_view": {"gradient_as_bucket_view": True},
    "find_unused": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
}


class _BnMlp(nn.Module):
    """Linear + BatchNorm (so DDP broadcasts buffers every forward) + Linear, optionally with an unused layer."""

    def __init__(self, with_unused: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 4)
        self.unused = nn.Linear(32, 4) if with_unused else None

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def _train_ddp(rank: int, group, kwargs: dict) -> dict[str, torch.Tensor]:
    """20 SGD steps of DDP on `group`; rank-dependent synthetic data that does not depend on the backend."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = _BnMlp(with_unused=kwargs.get("find_unused_parameters", False))
    ddp = DDP(model, process_group=group, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(DDP_STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, {n for n, _ in model.named_parameters()}


def _ddp_parity_worker(rank: int, world_size: int) -> dict:
    # The default group is "tuned" (launch's backend); gloo runs the identical training on a second group.
    gloo = dist.new_group(backend="gloo")
    results = {}
    for name, kwargs in DDP_VARIANTS.items():
        try:
            (tuned, param_names), (reference, _) = _train_ddp(rank, None, kwargs), _train_ddp(rank, gloo, kwargs)
            results[name] = {"tuned": tuned, "gloo": reference, "param_names": param_names}
        except Exception:  # noqa: BLE001 - reported per variant by the test
            results[name] = traceback.format_exc()
    return results


@functools.cache
def _ddp_runs(world_size: int):
    try:
        return launch(world_size, _ddp_parity_worker, timeout_s=LAUNCH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - cached so every variant reports it without relaunching
        return exc


@pytest.mark.parametrize("variant", list(DDP_VARIANTS))
@pytest.mark.parametrize("world_size", [2, 3], ids=lambda n: f"ws{n}")
def test_ddp_matches_gloo(world_size, variant):
    runs = _ddp_runs(world_size)
    if isinstance(runs, Exception):
        raise runs
    reference = None
    for rank, per_rank in enumerate(runs):
        result = per_rank[variant]
        assert not isinstance(result, str), f"rank {rank} failed in variant {variant}:\n{result}"
        tuned, gloo = result["tuned"], result["gloo"]
        assert tuned.keys() == gloo.keys()
        for key in tuned:
            torch.testing.assert_close(tuned[key], gloo[key], rtol=1e-6, atol=1e-7,
                                       msg=lambda m, k=key, r=rank: f"rank {r}, {k}: tuned vs gloo: {m}")
        # DDP keeps parameters identical across ranks (tuned's reductions are bit-identical on every rank). Buffers
        # are not: rank 0's are broadcast before each forward, which then updates them from local data.
        if reference is None:
            reference = tuned
        for key in result["param_names"]:
            assert torch.equal(tuned[key], reference[key]), f"rank {rank}'s {key} differs from rank 0's"


# ---------------------------------------------------------------------------------------------------------------
# DDP overlap


class _WaitForBucket(torch.autograd.Function):
    """Identity whose backward calls `probe` (which waits for a bucket's all-reduce to finish)."""

    @staticmethod
    def forward(ctx, x, probe):
        ctx.probe = probe
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.probe()
        return grad, None


class _OverlapNet(nn.Module):
    """first -> _WaitForBucket -> three 256x256 layers: the later layers' gradients are ready (and their buckets
    reduced) while autograd still has to go through the probe and the first layer."""

    def __init__(self, probe):
        super().__init__()
        self.probe = probe
        self.first = nn.Linear(32, 256)
        self.rest = nn.Sequential(nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                  nn.Linear(256, 256))

    def forward(self, x):
        return self.rest(_WaitForBucket.apply(self.first(x), self.probe))


def _ddp_overlap_worker(rank: int, world_size: int) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    buckets: list[dict] = []
    done_event = threading.Event()
    probe_log: dict = {}

    def probe():
        # Runs inside backward, after the later layers' gradients and before the first layer's.
        if not probe_log.get("enabled"):
            return
        probe_log["start"] = time.perf_counter()
        probe_log["saw_completion"] = done_event.wait(timeout=30.0)
        probe_log["end"] = time.perf_counter()

    torch.manual_seed(0)
    model = _OverlapNet(probe)
    first_weight = model.first.weight
    ddp = DDP(model, bucket_cap_mb=0.25)

    def recording_hook(state, bucket):
        record = {"index": bucket.index(), "has_first": any(p is first_weight for p in bucket.parameters()),
                  "issued": time.perf_counter(), "done": None}
        buckets.append(record)
        fut = default_hooks.allreduce_hook(state, bucket)  # PyTorch's own equivalent of DDP's default hook

        def mark_done(f):
            record["done"] = time.perf_counter()
            if not record["has_first"]:
                done_event.set()
            return f.value()

        return fut.then(mark_done)

    ddp.register_comm_hook(None, recording_hook)
    first_grad_at = {}
    first_weight.register_post_accumulate_grad_hook(lambda p: first_grad_at.update(t=time.perf_counter()))

    gen = torch.Generator().manual_seed(7 + rank)
    iterations = []
    # DDP's first iteration puts every parameter in one bucket (torch 2.x, without find_unused_parameters); it
    # rebuilds the buckets in gradient-ready order at the start of the second, so iterations 1 and 2 are checked.
    for it in range(3):
        buckets.clear()
        done_event.clear()
        probe_log.clear()
        probe_log["enabled"] = it > 0
        first_grad_at.clear()
        x = torch.randn(16, 32, generator=gen)
        ddp(x).square().mean().backward()
        if it > 0:
            iterations.append({"buckets": [dict(b) for b in buckets], "probe": dict(probe_log),
                               "first_grad": first_grad_at.get("t")})
    return iterations


def test_ddp_overlaps_allreduce_with_backward():
    """A gradient bucket's all-reduce is issued and completes while the backward pass is still running.

    Method: the model is ``first -> probe -> three 256x256 layers`` with ``bucket_cap_mb=0.25``, so the later
    layers' gradients fill buckets that do not hold ``first``'s parameters, and autograd reaches the probe only
    after those gradients are ready (DDP has then issued their buckets). The probe, which runs inside backward,
    waits (bounded) until such a bucket's all-reduce future completes. The comm hook is PyTorch's own
    ``default_hooks.allreduce_hook`` (the Python twin of DDP's built-in hook: divide, ``all_reduce(async_op=True)``)
    wrapped only to record when each bucket was issued and completed; a post-accumulate-grad hook on
    ``first.weight`` (the last gradient autograd produces) marks the end of backward. A backend that deferred work
    to ``wait()`` or the end of backward would leave the probe waiting until its bound and fail here.
    """
    for rank, iterations in enumerate(launch(2, _ddp_overlap_worker, timeout_s=LAUNCH_TIMEOUT_S)):
        for it, info in enumerate(iterations):
            where = f"rank {rank}, iteration {it + 1}"
            early = [b for b in info["buckets"] if not b["has_first"]]
            assert early, f"{where}: every bucket holds the first layer's parameters: {info['buckets']}"
            assert info["probe"].get("saw_completion"), (
                f"{where}: no bucket's all_reduce completed while backward waited in the probe for 30 s: "
                f"{info['buckets']}")
            assert info["first_grad"] is not None, f"{where}: the first layer's gradient hook never ran"
            bucket = min(early, key=lambda b: b["done"] or float("inf"))
            assert bucket["issued"] < info["probe"]["start"], f"{where}: bucket issued after backward reached probe"
            assert bucket["done"] is not None and bucket["done"] < info["first_grad"], (
                f"{where}: bucket {bucket['index']} completed at {bucket['done']}, after the first layer's gradient "
                f"at {info['first_grad']}")


# ---------------------------------------------------------------------------------------------------------------
# FSDP2

# name: (param dtype of the mixed-precision policy or None, gradient divide factor or None)
FSDP_REDUCTIONS = {
    "avg": (None, None),
    "premul_sum": (None, 4.0),
    "bf16_mixed": (torch.bfloat16, None),
}
FSDP_VARIANTS = [(red, reshard) for red in FSDP_REDUCTIONS for reshard in (True, False)]


def _fsdp_variant_name(reduction: str, reshard: bool) -> str:
    return f"{reduction}-{'reshard' if reshard else 'keep'}"


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)


def _reference_step(ref: nn.Module, world_size: int, step: int, param_dtype, factor) -> None:
    """What FSDP computes, in one process: per-rank gradients (in param_dtype for mixed precision, from a cast copy
    of the fp32 parameters as FSDP's all-gather produces them), cast to fp32, summed in rank order and divided by the
    world size (AVG) or by `factor` (PREMUL_SUM(1/factor))."""
    total = [torch.zeros_like(p) for p in ref.parameters()]
    for r in range(world_size):
        replica = copy.deepcopy(ref)
        if param_dtype is not None:
            replica = replica.to(param_dtype)
        x, y = _batch(r, step)
        out = replica(x.to(param_dtype) if param_dtype is not None else x)
        F.mse_loss(out.float(), y).backward()
        for acc, p in zip(total, replica.parameters()):
            acc += p.grad.float()
    divisor = factor if factor is not None else float(world_size)
    for p, acc in zip(ref.parameters(), total):
        p.grad = acc / divisor


def _fsdp_train(rank: int, world_size: int, mesh, reduction: str, reshard: bool) -> dict:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

    param_dtype, factor = FSDP_REDUCTIONS[reduction]
    torch.manual_seed(0)
    model = _mlp()
    ref = copy.deepcopy(model)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    if factor is not None:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(factor)
    # The reduce-scatter op FSDP picks for this configuration (documents which path the variant covers).
    _, _, op, _ = _get_gradient_divide_factors(mesh.get_group(), None, torch.float32, "cpu", factor)
    op_name = str(getattr(op, "op", op))  # a ReduceOp (PREMUL_SUM with its factor) or a bare RedOpType

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(FSDP_STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        F.mse_loss(model(x).float(), y).backward()
        opt.step()
        ref_opt.zero_grad()
        _reference_step(ref, world_size, step, param_dtype, factor)
        ref_opt.step()
    full = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    return {"op": op_name, "fsdp": full, "ref": {k: v.detach().clone() for k, v in ref.named_parameters()}}


def _fsdp_worker(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    torch.use_deterministic_algorithms(True)
    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    for reduction, reshard in FSDP_VARIANTS:
        name = _fsdp_variant_name(reduction, reshard)
        try:
            results[name] = _fsdp_train(rank, world_size, mesh, reduction, reshard)
        except Exception:  # noqa: BLE001 - reported per variant by the test
            results[name] = traceback.format_exc()
    return results


@functools.cache
def _fsdp_runs():
    try:
        return launch(2, _fsdp_worker, timeout_s=LAUNCH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "keep"])
@pytest.mark.parametrize("reduction", list(FSDP_REDUCTIONS))
def test_fsdp2_matches_reference(reduction, reshard):
    runs = _fsdp_runs()
    if isinstance(runs, Exception):
        raise runs
    expected_op = {"avg": "AVG", "premul_sum": "PREMUL_SUM", "bf16_mixed": "AVG"}[reduction]
    tol = dict(rtol=2e-2, atol=2e-3) if reduction == "bf16_mixed" else dict(rtol=1e-5, atol=1e-6)
    for rank, per_rank in enumerate(runs):
        result = per_rank[_fsdp_variant_name(reduction, reshard)]
        assert not isinstance(result, str), f"rank {rank} failed:\n{result}"
        assert expected_op in result["op"], f"FSDP picked {result['op']}, expected {expected_op}"
        for name, value in result["fsdp"].items():
            torch.testing.assert_close(value, result["ref"][name], **tol,
                                       msg=lambda m, n=name, r=rank: f"rank {r}, {n}: FSDP2 vs reference: {m}")
