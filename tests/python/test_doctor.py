"""tunedist.doctor in one process: each static and run-time check fires on a job that has the problem and stays ok
on one that does not; the /dev/shm need against real tuned backends; the learning-rate rule.

Multi-process checks (DDP, samplers, backends of real groups) and the CLI are in test_doctor_dist.py.
"""

import copy
import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from tunedist import _C
from tunedist.doctor import LinearScalingLR, Machine, RuntimeOptions, ScalingRule, check, scaled_lr, static_findings
from tunedist.doctor.runtime import Timing, check_fetch_time
from tunedist.doctor.shm_need import MAX_SLOT_BYTES, ShmSpace, check_shm, group_shm_bytes
from tunedist.doctor.static import check_threads, check_torchrun

FAST = RuntimeOptions(steps=3, warmup=1)
TORCHRUN_ENV = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _loader(batch_size=16, n=128, **kw) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.randn(n, 2)), batch_size=batch_size, **kw)


class SlowDataset(Dataset):
    """Each sample costs `delay_s` to produce, like a decode from disk."""

    def __init__(self, n: int, delay_s: float):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.randn(8), torch.randn(2)


def _run(model=None, loader=None, optimizer=None, **kw):
    model = model or _model()
    return check(model, loader or _loader(), optimizer, options=kw.pop("options", FAST), include_static=False,
                 show=False, **kw)


# --------------------------------------------------------------------------------------------------------------
# /dev/shm


@pytest.mark.parametrize("ranks", [1, 2, 16, 17])  # 16 -> 17 crosses a page of control blocks
@pytest.mark.parametrize("slot", [None, 64 << 10])
def test_group_shm_bytes_matches_real_backend(monkeypatch, ranks, slot):
    """The engine sizes its segment when the backend is created (the pages are taken at the first collective)."""
    if slot is None:
        monkeypatch.delenv("TUNEDIST_SLOT_BYTES", raising=False)
    else:
        monkeypatch.setenv("TUNEDIST_SLOT_BYTES", str(slot))
    backend = _C.create_backend(dist.HashStore(), 0, ranks, datetime.timedelta(seconds=5))
    assert _C.reserved_shm_bytes(backend) == group_shm_bytes(ranks)
    assert group_shm_bytes(ranks) == group_shm_bytes(ranks, slot or (1 << 20))


def test_shm_check_verdicts(tmp_path):
    free = ShmSpace.of().free
    ok = check_shm(2, {}, shm_dir="/dev/shm")
    assert ok.verdict == "ok" and "4.0 MiB" in ok.evidence
    ranks = free // (2 * MAX_SLOT_BYTES) + 1  # 1 GiB slots: more than the free space
    fail = check_shm(ranks, {"TUNEDIST_SLOT_BYTES": str(MAX_SLOT_BYTES)})
    assert fail.verdict == "fail" and "first collective fails" in fail.evidence and "--shm-size" in fail.fix
    warn = check_shm(2, {}, max_share=1e-9)  # a 4 MiB need over a near-zero allowed share of the free space
    assert warn.verdict == "warn" and "DataLoader" in warn.evidence
    assert check_shm(2, {}, groups=3).evidence.startswith("3 tuned group(s) x 2 ranks")
    bad = check_shm(2, {"TUNEDIST_SLOT_BYTES": "5000"})
    assert bad.verdict == "fail" and "multiple of 4096" in bad.evidence
    gone = check_shm(2, {}, shm_dir=str(tmp_path / "absent"))
    assert gone.verdict == "fail" and "unavailable" in gone.evidence


# --------------------------------------------------------------------------------------------------------------
# Static checks


def _static(machine: Machine, model=None):
    return {f.check: f for f in static_findings(model, machine=machine)}


def test_static_without_group_skips_backends_honestly():
    found = _static(Machine(env={}, gpu=False))
    assert found["backend.cpu"].evidence.startswith("skipped: no process group")
    assert found["backend.cuda"].evidence == "skipped: no GPU"
    assert found["model.data_parallel"].evidence == "skipped: no model given"
    assert "nccl.socket_ifname" in found and "gloo.socket_ifname" in found
    assert _static(Machine(env={}, gpu=True))["backend.cuda"].evidence.startswith("skipped: no process group")


def test_data_parallel_flagged():
    assert _static(Machine(env={}), torch.nn.DataParallel(_model()))["model.data_parallel"].verdict == "warn"
    assert _static(Machine(env={}), _model())["model.data_parallel"].verdict == "ok"


@pytest.mark.parametrize("change, verdict, words", [
    pytest.param({}, "ok", "RANK=1 WORLD_SIZE=4", id="consistent"),
    pytest.param({"LOCAL_WORLD_SIZE": None}, "fail", "LOCAL_WORLD_SIZE unset", id="missing"),
    pytest.param({"RANK": "4"}, "fail", "RANK=4 outside [0, WORLD_SIZE=4)", id="rank-range"),
    pytest.param({"LOCAL_RANK": "2"}, "fail", "LOCAL_RANK=2 outside", id="local-rank-range"),
    pytest.param({"LOCAL_WORLD_SIZE": "8"}, "fail", "LOCAL_WORLD_SIZE=8 > WORLD_SIZE=4", id="local-gt-world"),
    pytest.param({"MASTER_PORT": "70000"}, "fail", "MASTER_PORT=70000", id="port"),
    pytest.param({"WORLD_SIZE": "four"}, "fail", "not an integer", id="not-int"),
    pytest.param({"WORLD_SIZE": "3", "RANK": "0"}, "warn", "not a multiple", id="uneven-hosts"),
])
def test_torchrun_variables(change, verdict, words):
    env = {k: v for k, v in {**TORCHRUN_ENV, **change}.items() if v is not None}
    f = check_torchrun(Machine(env=env).resolved())
    assert f.verdict == verdict and words in f.evidence, f
    assert check_torchrun(Machine(env={}).resolved()).evidence.startswith("skipped: not started by torchrun")


@pytest.mark.parametrize("threads, ranks, cores, gpu, verdict", [
    pytest.param(4, 2, 2, False, "warn", id="oversubscribed"),
    pytest.param(1, 2, 2, False, "ok", id="one-per-core"),
    pytest.param(1, 1, 8, False, "warn", id="idle-cores-cpu"),
    pytest.param(1, 1, 8, True, "ok", id="idle-cores-gpu"),
])
def test_threads_against_cores(threads, ranks, cores, gpu, verdict):
    m = Machine(env={"LOCAL_WORLD_SIZE": str(ranks)}, gpu=gpu, threads=threads, cores=cores).resolved()
    f = check_threads(m)
    assert f.verdict == verdict, f
    if verdict == "warn":
        assert f"OMP_NUM_THREADS={max(1, cores // ranks)}" in f.fix
    real = check_threads(Machine(env={}).resolved())  # this process: its own threads and affinity
    assert f"{torch.get_num_threads()} intra-op threads" in real.evidence
    assert f"{len(os.sched_getaffinity(0))} cores" in real.evidence


# --------------------------------------------------------------------------------------------------------------
# Run-time checks


def test_workers_and_batch():
    r = _run(loader=_loader(batch_size=8))
    assert r["loader.num_workers"].verdict == "warn" and r["batch.per_device"].verdict == "warn"
    assert "8 samples" in r["batch.per_device"].evidence and r.measurements["batch_per_device"] == 8
    r = _run(loader=_loader(batch_size=32, num_workers=1))
    assert r["loader.num_workers"].verdict == "ok" and r["batch.per_device"].verdict == "ok"
    assert r["loader.sampler"].verdict == "ok"  # world size 1


def test_fetch_time_decision():
    """The verdict from given timings (no clock): warn above 10% of the step, ok at or below."""
    def timing(fetch_ms, step_ms):
        return Timing([fetch_ms / 1e3] * 3, [step_ms / 1e3] * 3, 16, [False] * 3)

    assert check_fetch_time(timing(64, 1), 0.10).verdict == "warn"
    assert check_fetch_time(timing(10.5, 100), 0.10).verdict == "warn"
    assert check_fetch_time(timing(10, 100), 0.10).verdict == "ok"
    assert check_fetch_time(timing(0.1, 100), 0.10).verdict == "ok"
    finding = check_fetch_time(timing(64, 1), 0.10)
    assert "fetch 64.00 ms vs step 1.00 ms" in finding.evidence and "num_workers" in finding.fix


def test_fetch_time_share():
    """Measured: a loader that sleeps 4 ms per sample (64 ms per batch of 16) and a step that sleeps 100 ms. Sleeps
    only set lower bounds, so the test asserts those and that each verdict follows from what was measured (a host
    that stalls the fetch of the fast case for over 10 ms may honestly say warn)."""
    slow = _run(loader=DataLoader(SlowDataset(64, 0.004), batch_size=16))
    assert slow.measurements["fetch_ms"] >= 64.0, slow["loader.fetch_time"]
    model = _model()

    def heavy_step(batch):
        model(batch[0]).sum().backward()
        time.sleep(0.1)

    fast = _run(model, _loader(), step=heavy_step)
    assert fast.measurements["step_ms"] >= 100.0, fast["loader.fetch_time"]
    for r in (slow, fast):
        m = r.measurements
        assert r["loader.fetch_time"].verdict == ("warn" if m["fetch_ms"] > 0.10 * m["step_ms"] else "ok"), m


def test_precision_on_gpu_decision():
    assert _run()["gpu.precision"].evidence == "skipped: no GPU"
    assert _run(gpu=True)["gpu.precision"].verdict == "warn"
    model = _model()

    def amp_step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch[0]).float().mean()
        loss.backward()

    assert _run(model, step=amp_step, gpu=True)["gpu.precision"].verdict == "ok"
    half = _model().to(torch.bfloat16)
    loader = DataLoader(TensorDataset(torch.randn(64, 8, dtype=torch.bfloat16)), batch_size=16)
    assert _run(half, loader, gpu=True)["gpu.precision"].verdict == "ok"


def test_pin_memory_on_gpu_decision():
    assert _run(loader=_loader(pin_memory=False))["loader.pin_memory"].evidence == "skipped: no GPU"
    assert _run(loader=_loader(pin_memory=False), gpu=True)["loader.pin_memory"].verdict == "warn"
    with pytest.warns(UserWarning):  # torch: pin_memory without an accelerator pins nothing
        assert _run(loader=_loader(pin_memory=True), gpu=True)["loader.pin_memory"].verdict == "ok"


def test_optimizer_parameters():
    model = _model()
    assert _run(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))["optimizer.params"].verdict == "ok"
    other = torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1)  # built on a copy: steps a model nobody uses
    assert _run(model, optimizer=other)["optimizer.params"].verdict == "fail"
    partial = torch.optim.SGD(model[0].parameters(), lr=0.1)
    assert _run(model, optimizer=partial)["optimizer.params"].verdict == "warn"
    assert _run(model)["optimizer.params"].evidence == "skipped: no optimizer given"


def test_default_step_leaves_model_and_grads_as_they_were():
    model = _model()
    model(torch.randn(4, 8)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    weights = [p.detach().clone() for p in model.parameters()]
    _run(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), weights))


def test_user_step_runs_warmup_plus_steps_and_short_loader_is_an_error():
    seen = []
    _run(step=seen.append, options=RuntimeOptions(steps=4, warmup=2))
    assert len(seen) == 6 and all(b[0].shape == (16, 8) for b in seen)
    with pytest.raises(ValueError, match="yielded 2 batches"):
        _run(loader=_loader(n=32), options=RuntimeOptions(steps=3, warmup=1))
    with pytest.raises(ValueError, match="no parameters"):
        _run(torch.nn.ReLU())


# --------------------------------------------------------------------------------------------------------------
# Learning rate


def test_scaled_lr_and_warmup_grow_with_global_batch():
    assert scaled_lr(0.1, world_size=8, batch_per_device=32, base_batch=256) == pytest.approx(0.1)
    assert scaled_lr(0.1, world_size=32, batch_per_device=256, base_batch=256) == pytest.approx(3.2)
    k2, k8, k32, k64 = (ScalingRule(w, 256, 256) for w in (2, 8, 32, 64))
    assert k32.warmup_epochs == pytest.approx(5.0)  # Goyal et al.: 5 epochs at 8k images
    assert k2.warmup_epochs < k8.warmup_epochs < k32.warmup_epochs == k64.warmup_epochs  # grows, then capped
    assert ScalingRule(1, 256, 256).warmup_epochs == 0.0
    with pytest.raises(ValueError, match="world_size"):
        ScalingRule(0, 16, 256)


def test_linear_scaling_scheduler_ramps_then_holds():
    rule = ScalingRule(world_size=4, batch_per_device=128, base_batch=256)  # k = 2
    steps_per_epoch = 32
    warmup = rule.warmup_steps(steps_per_epoch)  # 2 x 5/32 epoch = 10 steps
    assert warmup == 10
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = LinearScalingLR(opt, rule, steps_per_epoch)
    lrs = []
    for _ in range(warmup + 3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[warmup // 2] == pytest.approx(0.15)
    assert all(a < b for a, b in zip(lrs[:warmup], lrs[1:warmup + 1]))
    assert lrs[warmup:] == pytest.approx([0.2] * 3)
    state = sched.state_dict()
    again = LinearScalingLR(torch.optim.SGD([param], lr=0.1), rule, steps_per_epoch)
    again.load_state_dict(state)
    assert again.last_epoch == sched.last_epoch


# --------------------------------------------------------------------------------------------------------------
# The report


def test_report_table_and_json():
    from tunedist.doctor import Finding, Report

    long = "an evidence text long enough to wrap over several lines of the evidence column " * 2
    report = Report([Finding("a.ok", "ok", "fine"), Finding("b.bad", "fail", long, "do this")], {"step_ms": 1.5})
    lines = report.table(width=100).splitlines()
    assert lines[0].split() == ["check", "verdict", "evidence", "fix"]
    assert lines[2].split()[:3] == ["a.ok", "OK", "fine"]
    assert lines[3].startswith("b.bad") and "FAIL" in lines[3] and lines[3].rstrip().endswith("do this")
    assert lines[4].startswith(" ") and all(len(line) <= 100 for line in lines)
    assert lines[-1] == "1 ok, 0 warn, 1 fail"
    assert report.failed and report.worst == "fail" and [f.check for f in report.problems()] == ["b.bad"]
    data = json.loads(report.to_json())
    assert data["findings"][1]["fix"] == "do this" and data["measurements"] == {"step_ms": 1.5}
    with pytest.raises(KeyError, match="a.ok, b.bad"):
        report["c"]


def test_sampler_without_group_reads_world_size_from_env():
    two = Machine(env={"WORLD_SIZE": "2", "RANK": "1"})
    ds = TensorDataset(torch.randn(128, 8))  # 64 per rank: 4 batches of 16
    plain = _run(loader=DataLoader(ds, batch_size=16), machine=two)["loader.sampler"]
    assert plain.verdict == "warn" and "2 ranks train on the same batches" in plain.evidence
    sharded = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, num_replicas=2, rank=1))
    assert _run(loader=sharded, machine=two)["loader.sampler"].verdict == "ok"
    wrong = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    assert _run(loader=wrong, machine=two)["loader.sampler"].verdict == "fail"
    assert _run(loader=DataLoader(ds, batch_size=16))["loader.sampler"].verdict == "ok"  # world size 1
