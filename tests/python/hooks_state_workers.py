"""Workers of test_hooks_state.py (module level, so spawned ranks can import them)."""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_default
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel as DDP

import tunedist.hooks as td_hooks
from hooks_workers import MixedNet, batch, corrected_batched_powerSGD_hook, train
from tunedist.hooks import default as td_default
from tunedist.hooks import powerSGD as td_psgd

PSGD_OPTS = dict(matrix_approximation_rank=2, start_powerSGD_iter=2, random_seed=11)


# ---------------------------------------------------------------------------------------------------------------
# Resume: 10 steps, checkpoint, 10 more in new processes == 20 straight.

def _install_resumable(how: str, warm: bool, state=None):
    opts = dict(PSGD_OPTS, warm_start=warm)
    if how == "state_dict":
        def install(ddp):
            s = td_hooks.register(ddp, "powersgd", **opts)
            if state is not None:
                s.load_state_dict(state)
            return s
    else:
        def install(ddp):
            s = state if state is not None else td_psgd.PowerSGDState(None, **opts)
            ddp.register_comm_hook(s, td_psgd.powerSGD_hook)
            return s
    return install


class _BiasFirstLinear(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        ref = nn.Linear(n_in, n_out)
        self.bias = nn.Parameter(ref.bias.detach().clone())
        self.weight = nn.Parameter(ref.weight.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ReadyOrderNet(nn.Module):
    """Parameters registered in the order their gradients become ready (last layer first, bias before weight).

    DDP's first-iteration bucket follows registration order and its rebuilt buckets follow ready order; here they
    agree, so per-bucket state saved after the rebuild fits a new process's first step. For other models the first
    step of a resumed run sees the bucket permuted (torch's hook has the same limitation): resume those with a few
    uncompressed steps (start_powerSGD_iter above the restored iter) or a layout that is the same in both.
    """

    def __init__(self):
        super().__init__()
        dims = [32, 64, 64, 64, 10]
        self.layers = nn.ModuleList([_BiasFirstLinear(a, b) for a, b in zip(dims[:-1], dims[1:])][::-1])

    def forward(self, x):
        for i, layer in enumerate(reversed(self.layers)):
            x = layer(x) if i == len(self.layers) - 1 else torch.tanh(layer(x))
        return x


def seq_net() -> nn.Module:
    return ReadyOrderNet()


RESUME_CONFIGS = [(how, warm) for how in ("state_dict", "pickle") for warm in (True, False)]


def _checkpoint_path(directory: str, rank: int, how: str, warm: bool) -> Path:
    return Path(directory) / f"{how}_{'warm' if warm else 'cold'}_rank{rank}.pt"


def resume_first_half(rank: int, world_size: int, directory: str) -> dict:
    """Per config: 20 straight steps, and 10 steps saved to a checkpoint."""
    out = {}
    for how, warm in RESUME_CONFIGS:
        params20, state20, _ = train(rank, None, _install_resumable(how, warm), steps=20, model_fn=seq_net)
        torch.manual_seed(0)
        model = seq_net()
        _, state, _ = train(rank, None, _install_resumable(how, warm), steps=10, model=model)
        saved = state.state_dict() if how == "state_dict" else pickle.dumps(state)
        torch.save({"model": model.state_dict(), "hook": saved}, _checkpoint_path(directory, rank, how, warm))
        out[(how, warm)] = {"params": params20, "iter": state20.iter}
    return out


def resume_second_half(rank: int, world_size: int, directory: str) -> dict:
    """Per config: restore the checkpoint in these new processes, 10 more steps."""
    out = {}
    for how, warm in RESUME_CONFIGS:
        checkpoint = torch.load(_checkpoint_path(directory, rank, how, warm), weights_only=(how == "state_dict"))
        model = seq_net()
        model.load_state_dict(checkpoint["model"])
        saved = checkpoint["hook"] if how == "state_dict" else pickle.loads(checkpoint["hook"])
        params, state, _ = train(rank, None, _install_resumable(how, warm, saved), steps=10, model=model,
                                 start_step=10)
        out[(how, warm)] = {"params": params, "iter": state.iter}
    return out


def pickle_format_worker(rank: int, world_size: int) -> dict:
    ours = td_psgd.PowerSGDState(None, start_powerSGD_iter=5, random_seed=3)
    ref = torch_psgd.PowerSGDState(None, start_powerSGD_iter=5, random_seed=3)
    for s in (ours, ref):
        s.iter = 7
        s.rng.randint(10)  # a copy for ours: draw on the real state below
    ref.rng.randint(10)
    ours_rng_state = td_psgd.PowerSGDState(None, random_seed=3).rng
    ours_rng_state.randint(10)
    ours.rng = ours_rng_state
    torch_to_ours = td_psgd.PowerSGDState.__new__(td_psgd.PowerSGDState)
    torch_to_ours.__setstate__(ref.__getstate__())
    ours_to_torch = torch_psgd.PowerSGDState.__new__(torch_psgd.PowerSGDState)
    ours_to_torch.__setstate__(pickle.loads(pickle.dumps(ours)).__getstate__())
    return {
        "keys_ours": sorted(ours.__getstate__()), "keys_torch": sorted(ref.__getstate__()),
        "torch_to_ours_iter": torch_to_ours.iter, "ours_to_torch_iter": ours_to_torch.iter,
        "rng_draws_equal": [torch_to_ours.rng.randint(10**9) for _ in range(1)] == [ref.rng.randint(10**9)]
        and ours_to_torch.rng.randint(10**9) == pickle.loads(pickle.dumps(ours)).rng.randint(10**9),
        "group_restored": pickle.loads(pickle.dumps(ours)).process_group is dist.distributed_c10d._get_default_group(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Edge cases: ours (drop-in, native) against a reference run.

class BiasOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.linspace(-1, 1, 10))
        self.b = nn.Parameter(torch.linspace(0, 1, 10))

    def forward(self, x):
        return torch.tanh(x * self.a + self.b)


class Small(nn.Module):
    """Tensors smaller than the rank (3x40, 2x40 at rank 4), a layer used before it is registered (so DDP's rebuilt
    buckets differ from its first ones), optionally a layer forward never uses."""

    def __init__(self, with_unused: bool = False):
        super().__init__()
        self.late = nn.Linear(40, 3)
        self.early = nn.Linear(10, 40)
        self.tiny = nn.Linear(40, 2)
        self.unused = nn.Linear(3, 3) if with_unused else None

    def forward(self, x):
        h = torch.tanh(self.early(x))
        return torch.cat([self.late(h), self.tiny(h), torch.zeros(x.shape[0], 5)], dim=1)


class WithEmpty(nn.Module):
    """A zero-element parameter: with a tiny bucket cap it gets a bucket of its own, an empty one."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 3)
        self.empty = nn.Parameter(torch.zeros(0, 4))

    def forward(self, x):
        return self.fc(x) + self.empty.sum()


def _psgd_pair(opts, batched=False):
    torch_hook = torch_psgd.batched_powerSGD_hook if batched else torch_psgd.powerSGD_hook
    ours_hook = td_psgd.batched_powerSGD_hook if batched else td_psgd.powerSGD_hook
    kind = "batched_powersgd" if batched else "powersgd"
    return (lambda ddp: (ddp.register_comm_hook(s := torch_psgd.PowerSGDState(ddp.process_group, **opts),
                                                torch_hook), s)[1],
            lambda ddp: (ddp.register_comm_hook(s := td_psgd.PowerSGDState(ddp.process_group, **opts),
                                                ours_hook), s)[1],
            lambda ddp: td_hooks.register(ddp, kind, **opts))


def _no_hook(ddp):
    return None


SMALL_OPTS = dict(matrix_approximation_rank=4, start_powerSGD_iter=2, min_compression_rate=0.1)
# name -> (model, width, out, ddp kwargs, (reference, dropin, native), tolerance, loop options)
EDGE = {
    "bias_only_powersgd": (BiasOnly, 10, 10, {}, _psgd_pair(PSGD_OPTS), 0, {}),
    "small_tensors_qr": (Small, 10, 10, {}, _psgd_pair(SMALL_OPTS), "kernels", {}),
    "rebuild_many_buckets": (Small, 10, 10, {"bucket_cap_mb": 0.001}, _psgd_pair(SMALL_OPTS), "kernels", {}),
    # torch's PowerSGD issues its P/Q allreduces from future callbacks, which races with DDP's own collectives
    # under find_unused_parameters (gloo reports a collective mismatch), so the fp16 hook is the reference here.
    "find_unused_fp16": (lambda: Small(with_unused=True), 10, 10, {"find_unused_parameters": True},
                         (lambda ddp: ddp.register_comm_hook(ddp.process_group, torch_default.fp16_compress_hook),
                          lambda ddp: ddp.register_comm_hook(ddp.process_group, td_default.fp16_compress_hook),
                          lambda ddp: td_hooks.register(ddp, "fp16")), 0, {}),
    "bucket_view_static_graph": (MixedNet, 32, 10, {"gradient_as_bucket_view": True, "static_graph": True},
                                 _psgd_pair(PSGD_OPTS), "kernels", {}),
    "no_sync_accumulation": (MixedNet, 32, 10, {}, _psgd_pair(PSGD_OPTS), "kernels", {"no_sync": True}),
    "grad_scaler_fp16": (MixedNet, 32, 10, {},
                         (lambda ddp: ddp.register_comm_hook(ddp.process_group, torch_default.fp16_compress_hook),
                          lambda ddp: ddp.register_comm_hook(ddp.process_group, td_default.fp16_compress_hook),
                          lambda ddp: td_hooks.register(ddp, "fp16")), 0, {"scaler": True}),
    "empty_bucket_allreduce": (WithEmpty, 10, 3, {"bucket_cap_mb": 0.0001},
                               (_no_hook,
                                lambda ddp: ddp.register_comm_hook(ddp.process_group, td_default.allreduce_hook),
                                lambda ddp: td_hooks.register(ddp, "allreduce")), 0, {}),
    "empty_bucket_powersgd": (WithEmpty, 10, 3, {"bucket_cap_mb": 0.0001},
                              (_no_hook, _psgd_pair(PSGD_OPTS)[1], _psgd_pair(PSGD_OPTS)[2]), "psgd", {}),
    "empty_bucket_batched": (WithEmpty, 10, 3, {"bucket_cap_mb": 0.0001},
                             (lambda ddp: ddp.register_comm_hook(
                                 torch_psgd.PowerSGDState(ddp.process_group, **PSGD_OPTS),
                                 corrected_batched_powerSGD_hook),
                              _psgd_pair(PSGD_OPTS, True)[1], _psgd_pair(PSGD_OPTS, True)[2]), "kernels", {}),
}
EDGE_CASES = list(EDGE)


def _edge_train(rank, group, model_fn, width, out, ddp_kwargs, install, loop):
    torch.manual_seed(0)
    model = model_fn()
    ddp = DDP(model, process_group=group, **ddp_kwargs)
    install(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if loop.get("scaler") else None
    for step in range(20):
        x, y = batch(rank, step, width, out)
        if loop.get("no_sync") and step % 2 == 0:
            with ddp.no_sync():
                F.mse_loss(ddp(x), y).backward()
            continue
        loss = F.mse_loss(ddp(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def edge_worker(rank: int, world_size: int) -> dict:
    # gloo, as in the parity tests: torch's PowerSGD hook issues collectives from future callbacks, racing DDP's
    # next bucket all_reduces, so on an asynchronous CPU backend ranks may issue them in different orders (`tuned`
    # reports that as a mismatch). On gloo these small models ran in order.
    gloo = dist.new_group(backend="gloo")
    results = {}
    for name, (model_fn, width, out, kwargs, (ref, dropin, native), tol, loop) in EDGE.items():
        try:
            entry = {label: _edge_train(rank, gloo, model_fn, width, out, kwargs, install, loop)
                     for label, install in (("reference", ref), ("dropin", dropin), ("native", native))}
            # "psgd" against DDP without a hook: PowerSGD only matches it up to compression (here: all tensors
            # in these models are vectors or below the threshold, so only the rounding of sum/size differs).
            # "kernels": float32 PowerSGD on our low-rank kernels rounds differently from torch's BLAS.
            entry["rtol"], entry["atol"] = {"psgd": (1e-5, 1e-6), "kernels": (1e-4, 1e-5)}.get(tol, (0, 0))
            entry["checked"] = len(entry["reference"])
            results[name] = entry
        except Exception:  # noqa: BLE001
            results[name] = traceback.format_exc()
    return results


# ---------------------------------------------------------------------------------------------------------------
# What reaches the process group.

class RecordingGroup(dist.ProcessGroup):
    """A process group that forwards allreduce to `inner` (gloo), recording what it was given; refuses `refuse`."""

    def __init__(self, inner, refuse=()):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.refuse = tuple(refuse)
        self.calls = []

    def allreduce(self, tensors, opts=None):
        t = tensors[0]
        if t.dtype in self.refuse:
            raise TypeError(f"RecordingGroup: allreduce of {t.dtype} is not supported")
        storage = t.untyped_storage()
        self.calls.append((t.dtype, t.numel(), storage.data_ptr(), storage.nbytes()))
        return self.inner.allreduce(tensors, opts) if opts is not None else self.inner.allreduce(tensors)


HALF_STEPS = 6


def half_bytes_worker(rank: int, world_size: int, precision: str) -> dict:
    hook = td_default.fp16_compress_hook if precision == "fp16" else td_default.bf16_compress_hook
    report = {}
    for label in ("dropin", "native"):
        group = RecordingGroup(dist.group.WORLD)

        def install(ddp, label=label, group=group):
            if label == "dropin":
                ddp.register_comm_hook(group, hook)
            else:
                td_hooks.register(ddp, precision, process_group=group)
            return None

        _, _, ddp = train(rank, None, install, steps=HALF_STEPS, ddp_kwargs={"bucket_cap_mb": 0.02})
        calls = group.calls[1:] if label == "native" else group.calls  # register() probes with one element first
        storages = {c[2]: c[3] for c in calls}
        report[label] = {"calls": calls, "distinct_storages": len(storages),
                         "distinct_storage_bytes": sum(storages.values())}
        report["param_numel"] = sum(p.numel() for p in ddp.parameters())
    report["steps"] = HALF_STEPS
    return report


def _error_of(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def errors_worker(rank: int, world_size: int) -> dict:
    def fresh():
        torch.manual_seed(0)
        return DDP(MixedNet())

    report = {}
    ddp = fresh()
    td_hooks.register(ddp, "powersgd", **PSGD_OPTS)
    report["second_register"] = _error_of(lambda: td_hooks.register(ddp, "fp16"))
    ddp = fresh()
    ddp.register_comm_hook(None, td_default.allreduce_hook)
    report["register_after_python_hook"] = _error_of(lambda: td_hooks.register(ddp, "allreduce"))
    ddp = fresh()
    ddp.register_comm_hook(None, td_psgd.powerSGD_hook)
    x, y = batch(rank, 0)
    report["dropin_state_none"] = _error_of(lambda: F.mse_loss(ddp(x), y).backward())
    dist.barrier()
    ddp = fresh()
    group = RecordingGroup(dist.group.WORLD, refuse=(torch.bfloat16,))
    report["missing_dtype"] = _error_of(lambda: td_hooks.register(ddp, "bf16", process_group=group))
    report["bad_start_iter"] = _error_of(lambda: td_hooks.register(fresh(), "powersgd", start_powerSGD_iter=1))
    report["unknown_hook"] = _error_of(lambda: td_hooks.register(fresh(), "fp8"))
    return report
