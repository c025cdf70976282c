"""tunedist.doctor: finds the known reasons a distributed training job is slow or broken, with evidence and a fix.

    python -m tunedist.doctor [--nproc-per-node N] [--json]     # static checks; exit status 1 on any fail
    report = tunedist.doctor.check(ddp_model, loader, optimizer)  # inside the job, on every rank

Static checks (tunedist.doctor.static): the backend per device of the initialised group (backend.cpu,
backend.cuda), DataParallel (model.data_parallel), the torchrun variables (launch.torchrun), /dev/shm against what
the tuned groups reserve (shm.size; tunedist.doctor.shm_need.group_shm_bytes), the NCCL/gloo environment
(tunedist.nccl_env), intra-op threads x ranks per host against cores (cpu.threads). Run-time checks
(tunedist.doctor.runtime): sampler, workers, fetch time, batch per device, GPU precision, optimizer parameters,
pin_memory. Learning rate: scaled_lr, ScalingRule and LinearScalingLR (tunedist.doctor.lr).
"""

from ..nccl_env import Finding, MachineProbe, nccl_findings, nccl_summary
from .lr import LinearScalingLR, ScalingRule, scaled_lr
from .report import Report, format_table
from .runtime import RuntimeOptions, check
from .shm_need import group_shm_bytes
from .static import Machine, static_findings

__all__ = ["Finding", "LinearScalingLR", "Machine", "MachineProbe", "Report", "RuntimeOptions", "ScalingRule",
           "check", "diagnose", "format_table", "group_shm_bytes", "nccl_findings", "nccl_summary", "scaled_lr",
           "static_findings"]


def diagnose(model=None, group=None, machine: Machine | None = None) -> Report:
    """The static checks alone, as a Report."""
    return Report(static_findings(model, group, machine))
