"""tunedist.doctor on real process groups (2 ranks, tuned and gloo, DDP) and `python -m tunedist.doctor` run as a
subprocess with crafted environments: each check fires on the job that has the problem and is ok on one without.
"""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_utils import launch
from tunedist.doctor import Machine, RuntimeOptions, check, static_findings
from tunedist.doctor.shm_need import MAX_SLOT_BYTES, ShmSpace

FAST = RuntimeOptions(steps=2, warmup=1)
CLI_TIMEOUT_S = 120


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(128, 8, generator=g), torch.randn(128, 2, generator=g))


def _verdicts(report) -> dict[str, tuple[str, str]]:
    return {f.check: (f.verdict, f.evidence) for f in report.findings}


def _ddp_job(rank, world_size):
    """Runs check() on a DDP model over the `tuned` group with good and bad loaders, optimizers and machines."""
    model = DDP(_model())
    ds = _dataset()
    good_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = {}
    out["good"] = _verdicts(check(model, DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds)), good_opt,
                                  options=FAST, show=(rank == 0)))
    out["plain"] = _verdicts(check(model, DataLoader(ds, batch_size=16), good_opt, options=FAST, show=False))
    pinned = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, num_replicas=world_size, rank=0))
    out["pinned_rank0"] = _verdicts(check(model, pinned, good_opt, options=FAST, show=False))
    copy_opt = torch.optim.SGD(copy.deepcopy(model.module).parameters(), lr=0.1)
    sharded = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds))
    out["copy_opt"] = _verdicts(check(model, sharded, copy_opt, options=FAST, show=False))
    one_host_each = Machine(env={**os.environ, "LOCAL_WORLD_SIZE": "1"})
    out["spans_hosts"] = _verdicts(check(model, sharded, good_opt, options=FAST, machine=one_host_each, show=False))
    out["gpu"] = _verdicts(check(model, sharded, good_opt, options=FAST, machine=Machine(gpu=True), show=False))
    out["gloo"] = _static(Machine(gpu=True), group=dist.new_group(backend="gloo"))
    out["cuda_only"] = _static(Machine(gpu=False), _model(), dist.new_group(backend="cuda:gloo"))  # nothing for CPU
    return out


@pytest.fixture(scope="module")
def ddp_results():
    return launch(2, _ddp_job, backend="tuned", env={"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"})


def test_ddp_on_tuned_good_job_is_clean(ddp_results):
    for rank, res in enumerate(ddp_results):
        good = res["good"]
        assert good["backend.cpu"] == ("ok", "cpu -> tuned"), rank
        assert good["loader.sampler"] == ("ok", "DistributedSampler over 2 ranks")
        assert good["optimizer.params"][0] == "ok" and good["launch.torchrun"][0] == "ok", good
        assert good["shm.size"][0] == "ok" and "2 ranks" in good["shm.size"][1]
        assert good["backend.cuda"] == ("ok", "skipped: no GPU") or torch.cuda.is_available()
        assert good["model.data_parallel"][0] == "ok"


def test_ddp_sampler_checks(ddp_results):
    for rank, res in enumerate(ddp_results):
        assert res["plain"]["loader.sampler"][0] == "warn" and "2 ranks train on the same" in \
            res["plain"]["loader.sampler"][1]
        # DistributedSampler(rank=0) on every rank: right on rank 0, overlapping shards on rank 1
        assert res["pinned_rank0"]["loader.sampler"][0] == ("ok" if rank == 0 else "fail"), rank


def test_ddp_optimizer_on_a_copy_fails(ddp_results):
    for res in ddp_results:
        verdict, evidence = res["copy_opt"]["optimizer.params"]
        assert verdict == "fail" and "4 of the optimizer's 4 parameters" in evidence


def test_tuned_across_hosts_is_hierarchical_and_the_cuda_verdict_follows_the_build(ddp_results):
    import tunedist

    for res in ddp_results:
        verdict, evidence = res["spans_hosts"]["backend.cpu"]
        assert verdict == "ok" and "spans hosts" in evidence and "gloo between hosts" in evidence
        # "tuned" maps CUDA to itself only when built with its NCCL side, which runs CUDA tensors on NCCL.
        if tunedist.nccl_compiled_in():
            verdict, evidence = res["gpu"]["backend.cuda"]
            assert verdict == "ok" and "cuda -> tuned" in evidence and "ProcessGroupNCCL" in evidence, evidence
        else:
            assert res["gpu"]["backend.cuda"] == ("warn", "cuda -> none: collectives on CUDA tensors fail")


def _static(machine, model=None, group=None):
    return {f.check: (f.verdict, f.evidence) for f in static_findings(model, group, machine)}


def test_gloo_groups(ddp_results):
    for res in ddp_results:
        cpu_verdict, cpu_evidence = res["gloo"]["backend.cpu"]
        assert cpu_verdict == "ok" and cpu_evidence.startswith("cpu -> gloo; all ranks are on this host")
        assert res["gloo"]["backend.cuda"][0] == "warn" and "cuda -> gloo" in res["gloo"]["backend.cuda"][1]
        assert res["gloo"]["shm.size"] == ("ok", "skipped: the CPU backend is gloo, not tuned")
        assert res["cuda_only"]["backend.cpu"][0] == "fail" and "cpu -> none" in res["cuda_only"]["backend.cpu"][1]


# --------------------------------------------------------------------------------------------------------------
# python -m tunedist.doctor

_STRIP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def _cli(*args, **env):
    base = {k: v for k, v in os.environ.items()
            if k not in _STRIP and not k.startswith(("NCCL_", "TORCH_NCCL_", "GLOO_", "TUNEDIST_"))}
    proc = subprocess.run([sys.executable, "-m", "tunedist.doctor", *args], env={**base, **env},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def test_cli_clean_environment_passes():
    proc = _cli()
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("NCCL network: ")
    assert "check" in proc.stdout and "verdict" in proc.stdout and "evidence" in proc.stdout and "fix" in proc.stdout
    assert "FAIL" not in proc.stdout and " 0 fail" in proc.stdout


def test_cli_broken_environment_fails_on_each_problem():
    ranks = ShmSpace.of().free // (2 * MAX_SLOT_BYTES) + 1  # 1 GiB slots for that many ranks exceed /dev/shm
    proc = _cli("--json", "--nproc-per-node", str(ranks), GLOO_SOCKET_IFNAME="nosuch9", NCCL_SOCKET_IFNAME="=nosuch",
                NCCL_ASYNC_ERROR_HANDLING="0", RANK="5", WORLD_SIZE="2", TUNEDIST_SLOT_BYTES=str(MAX_SLOT_BYTES))
    assert proc.returncode == 1, proc.stdout
    found = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    expected = {"gloo.socket_ifname": "fail", "nccl.socket_ifname": "fail", "nccl.async_error_handling": "warn",
                "nccl.deprecated_names": "warn", "launch.torchrun": "fail", "shm.size": "fail"}
    for name, verdict in expected.items():
        assert found[name]["verdict"] == verdict and found[name]["fix"], found[name]
    assert "existing interfaces:" in found["gloo.socket_ifname"]["evidence"]
