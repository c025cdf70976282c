"""The doctor's static checks: what can be told from the environment, the machine and the process group.

Each check returns one Finding (ok / warn / fail, evidence, fix); a check that does not apply says
"skipped: <why>" with verdict ok. Everything the checks read from outside can be handed in (env, gpu, probe,
threads, cores, shm_dir), so tests reach every verdict without a GPU or root.

- backend.cpu: the initialised group's backend for CPU tensors (dist.get_backend_config). ok: tuned or gloo;
  a group that spans hosts (WORLD_SIZE > LOCAL_WORLD_SIZE) on tuned is ok too (shared memory inside each host, gloo
  between hosts); fail: no CPU backend while the model is on the CPU (warn without a model).
- backend.cuda (GPU only): ok: nccl; warn: gloo (CUDA tensors through host memory); fail: none while the model is on
  CUDA (warn without a model).
- model.data_parallel: the model (or DDP's module) is a torch.nn.DataParallel: warn.
- launch.torchrun: once any torchrun variable is set, all six must be, integers in range (0 <= RANK < WORLD_SIZE,
  0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE, 1 <= MASTER_PORT <= 65535) and equal to the default group's
  rank and size: else fail; WORLD_SIZE not a multiple of LOCAL_WORLD_SIZE: warn.
- shm.size: see shm_need.check_shm (skipped when an initialised group's CPU backend is not tuned).
- nccl.* / gloo.*: see tunedist.nccl_env.
- cpu.threads: threads per rank x ranks on this host > cores in the affinity mask: warn (oversubscribed); without a
  GPU, <= half the cores: warn (idle cores).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..nccl_env import Finding, MachineProbe, nccl_findings
from .report import skipped
from .shm_need import DEFAULT_MAX_SHARE, SHM_DIR, check_shm

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Machine:
    """What the static checks see; None fields are read from this process and machine."""

    env: Mapping[str, str] | None = None
    gpu: bool | None = None  # None: torch.cuda.is_available()
    probe: MachineProbe = field(default_factory=MachineProbe)
    threads: int | None = None  # None: torch.get_num_threads()
    cores: int | None = None  # None: len(os.sched_getaffinity(0))
    shm_dir: str = SHM_DIR
    shm_max_share: float = DEFAULT_MAX_SHARE
    tuned_groups: int = 1  # tuned groups the job creates (each reserves its own segment)
    ranks_on_host: int | None = None  # None: LOCAL_WORLD_SIZE, else the group's size, else 1

    def resolved(self) -> Machine:
        return Machine(env=os.environ if self.env is None else self.env,
                       gpu=torch.cuda.is_available() if self.gpu is None else self.gpu, probe=self.probe,
                       threads=torch.get_num_threads() if self.threads is None else self.threads,
                       cores=len(os.sched_getaffinity(0)) if self.cores is None else self.cores,
                       shm_dir=self.shm_dir, shm_max_share=self.shm_max_share, tuned_groups=self.tuned_groups,
                       ranks_on_host=self.ranks_on_host)

    def int_env(self, name: str, default: int | None = None) -> int | None:
        try:
            return int(self.env.get(name, ""))
        except ValueError:
            return default


def backend_map(group=None) -> dict[str, str] | None:
    """{device type: backend name} of an initialised group (default: the default group), or None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    config = dist.get_backend_config(group)  # "cpu:tuned,cuda:nccl"; torch >= 2.1
    pairs = (item.split(":", 1) for item in config.split(",") if ":" in item)
    return {device.strip(): backend.strip().lower() for device, backend in pairs}


def model_device_type(model: torch.nn.Module | None) -> str | None:
    if model is None:
        return None
    for p in model.parameters():
        return p.device.type
    return None


def _ranks_here(m: Machine, group) -> int:
    if m.ranks_on_host:
        return m.ranks_on_host
    local = m.int_env("LOCAL_WORLD_SIZE")
    if local:
        return local
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def check_cpu_backend(m: Machine, backends: dict[str, str] | None, model_dev: str | None, group) -> Finding:
    check = "backend.cpu"
    if backends is None:
        return skipped(check, "no process group initialised (the doctor sees the backends inside the job)")
    name = backends.get("cpu", "none")
    world = dist.get_world_size(group)
    local = m.int_env("LOCAL_WORLD_SIZE", world)
    if name == "tuned" and world > local:
        return Finding(check, "ok", f"cpu -> tuned; the group spans hosts (WORLD_SIZE={world}, "
                       f"LOCAL_WORLD_SIZE={local}): shared memory inside each host, gloo between hosts")
    if name in ("tuned", "gloo"):
        hint = ("; all ranks are on this host, where tuned's shared-memory collectives beat gloo's loopback TCP "
                '(init_process_group("cpu:tuned,cuda:nccl"))' if name == "gloo" and world == local > 1 else "")
        return Finding(check, "ok", f"cpu -> {name}{hint}")
    if model_dev == "cuda":
        return Finding(check, "ok", f"cpu -> {name}; the model is on CUDA")
    verdict = "fail" if model_dev == "cpu" else "warn"
    return Finding(check, verdict, f"cpu -> {name}: collectives on CPU tensors"
                   + (" (the model's parameters)" if model_dev == "cpu" else " (metrics, barriers)") + " fail",
                   'map the CPU to tuned or gloo: init_process_group("cpu:tuned,cuda:nccl")')


def check_cuda_backend(m: Machine, backends: dict[str, str] | None, model_dev: str | None) -> Finding:
    check = "backend.cuda"
    if not m.gpu:
        return skipped(check, "no GPU")
    if backends is None:
        return skipped(check, "no process group initialised (the doctor sees the backends inside the job)")
    name = backends.get("cuda", "none")
    fix = 'map CUDA to NCCL: init_process_group("cpu:tuned,cuda:nccl") (or "nccl")'
    if name == "nccl":
        return Finding(check, "ok", "cuda -> nccl")
    if name == "tuned":
        from .. import nccl_compiled_in  # noqa: PLC0415

        if nccl_compiled_in():
            return Finding(check, "ok", "cuda -> tuned, which runs CUDA tensors on torch's ProcessGroupNCCL (prefer "
                           '"cpu:tuned,cuda:nccl" where code looks for NCCL by name or type)')
        return Finding(check, "fail" if model_dev == "cuda" else "warn",
                       "cuda -> tuned, but this tunedist build has no NCCL side: collectives on CUDA tensors fail",
                       fix + ", or rebuild tunedist with TUNEDIST_USE_NCCL=1")
    if name == "gloo":
        return Finding(check, "warn", "cuda -> gloo: every collective copies CUDA tensors through host memory and "
                       "TCP, many times slower than NCCL", fix)
    verdict = "fail" if model_dev == "cuda" else "warn"
    return Finding(check, verdict, f"cuda -> {name}: collectives on CUDA tensors fail", fix)


def check_data_parallel(model: torch.nn.Module | None) -> Finding:
    check = "model.data_parallel"
    if model is None:
        return skipped(check, "no model given")
    inner = getattr(model, "module", None)
    if isinstance(model, torch.nn.DataParallel) or isinstance(inner, torch.nn.DataParallel):
        return Finding(check, "warn", "the model is wrapped in torch.nn.DataParallel: one process drives every GPU "
                       "from threads under the GIL, replicates the model each step and gathers outputs on GPU 0",
                       "use DistributedDataParallel with one process per GPU (torchrun --nproc-per-node=<GPUs>)")
    return Finding(check, "ok", f"{type(model).__name__}, not DataParallel")


def _torchrun_problems(m: Machine, group) -> list[str]:
    env = m.env
    missing = [n for n in TORCHRUN_VARS if not env.get(n, "").strip()]
    problems = [f"{', '.join(missing)} unset"] if missing else []
    values = {}
    for name in TORCHRUN_VARS:
        if name != "MASTER_ADDR" and env.get(name, "").strip():
            try:
                values[name] = int(env[name])
            except ValueError:
                problems.append(f"{name}={env[name]!r} is not an integer")
    rank, world = values.get("RANK"), values.get("WORLD_SIZE")
    lrank, lworld = values.get("LOCAL_RANK"), values.get("LOCAL_WORLD_SIZE")
    if world is not None and world < 1:
        problems.append(f"WORLD_SIZE={world} < 1")
    if rank is not None and world is not None and not 0 <= rank < world:
        problems.append(f"RANK={rank} outside [0, WORLD_SIZE={world})")
    if lrank is not None and lworld is not None and not 0 <= lrank < lworld:
        problems.append(f"LOCAL_RANK={lrank} outside [0, LOCAL_WORLD_SIZE={lworld})")
    if lworld is not None and world is not None and lworld > world:
        problems.append(f"LOCAL_WORLD_SIZE={lworld} > WORLD_SIZE={world}")
    port = values.get("MASTER_PORT")
    if port is not None and not 1 <= port <= 65535:
        problems.append(f"MASTER_PORT={port} outside 1..65535")
    if dist.is_available() and dist.is_initialized() and group is None:
        if world is not None and dist.get_world_size() != world:
            problems.append(f"the default group has {dist.get_world_size()} ranks, WORLD_SIZE={world}")
        if rank is not None and dist.get_rank() != rank:
            problems.append(f"this process is rank {dist.get_rank()} of the default group, RANK={rank}")
    return problems


def check_torchrun(m: Machine, group=None) -> Finding:
    check = "launch.torchrun"
    if not any(m.env.get(n, "").strip() for n in TORCHRUN_VARS):
        return skipped(check, f"not started by torchrun (none of {', '.join(TORCHRUN_VARS)} set): one process")
    problems = _torchrun_problems(m, group)
    if problems:
        return Finding(check, "fail", "; ".join(problems),
                       "start every rank with torchrun (--nnodes, --nproc-per-node, --rdzv-endpoint), which sets "
                       "these consistently, or fix the values by hand")
    shown = " ".join(f"{n}={m.env[n]}" for n in TORCHRUN_VARS)
    world, lworld = int(m.env["WORLD_SIZE"]), int(m.env["LOCAL_WORLD_SIZE"])
    if world % lworld:
        return Finding(check, "warn", f"{shown}: WORLD_SIZE is not a multiple of LOCAL_WORLD_SIZE, so hosts run "
                       "different numbers of ranks and the slowest host paces every step",
                       "run the same number of ranks on every host")
    return Finding(check, "ok", shown)


def check_shm_size(m: Machine, backends: dict[str, str] | None, group) -> Finding:
    if backends is not None and backends.get("cpu") != "tuned":
        return skipped("shm.size", f"the CPU backend is {backends.get('cpu', 'none')}, not tuned")
    return check_shm(_ranks_here(m, group), m.env, m.tuned_groups, m.shm_dir, m.shm_max_share)


def check_threads(m: Machine, group=None) -> Finding:
    check = "cpu.threads"
    ranks = _ranks_here(m, group)
    used = m.threads * ranks
    shown = (f"{m.threads} intra-op threads per rank (torch.get_num_threads) x {ranks} ranks on this host = {used}; "
             f"{m.cores} cores in this process's affinity")
    best = max(1, m.cores // ranks)
    fix = f"OMP_NUM_THREADS={best} (or torch.set_num_threads({best})) in every rank"
    if used > m.cores:
        return Finding(check, "warn", shown + ": threads compete for cores and stall each other's collectives", fix)
    if not m.gpu and used <= m.cores // 2:
        return Finding(check, "warn", shown + ": CPU training leaves half the cores or more idle (torchrun sets "
                       "OMP_NUM_THREADS=1 when it is unset)", fix)
    return Finding(check, "ok", shown)


def static_findings(model: torch.nn.Module | None = None, group=None, machine: Machine | None = None) -> list[Finding]:
    """Every static check, in table order."""
    m = (machine or Machine()).resolved()
    backends = backend_map(group)
    model_dev = model_device_type(model)
    return [
        check_cpu_backend(m, backends, model_dev, group),
        check_cuda_backend(m, backends, model_dev),
        check_data_parallel(model),
        check_torchrun(m, group),
        check_shm_size(m, backends, group),
        *nccl_findings(m.env, m.probe),
        check_threads(m, group),
    ]
