"""Worker scripts that test_faults.py and test_security.py run under torchrun (``python -m torch.distributed.run``).

    torchrun --standalone --nproc-per-node=2 fault_workers.py MODE RESULT_DIR [ARGS...]

Each mode is one function below. A worker writes what it observed to ``RESULT_DIR/<mode>_rank<r>.json`` (the
test reads and judges it) and raises, so that torchrun fails, only where the mode says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import tunedist  # noqa: F401  (registers "tuned")

GROUP_TIMEOUT = timedelta(seconds=300)


def run_torchrun(mode: str, result_dir: Path, *args: str, timeout_s: float, max_restarts: int = 0,
                 wrapper: list[str] | None = None, env: dict | None = None) -> tuple[int | None, str]:
    """For the tests: runs MODE under a 2-rank standalone torchrun (inside `wrapper`, if given) and returns its exit
    code (None if it ran past `timeout_s` and was killed, workers included) and its combined output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.2", __file__, mode, str(result_dir), *args]
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    # A session of its own, so a timeout kills torchrun and its workers along with the wrapper.
    proc = subprocess.Popen((wrapper or []) + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def read_results(result_dir: Path, mode: str, world_size: int = 2) -> list[dict | None]:
    """What each rank wrote for MODE (None for a rank that wrote nothing)."""
    paths = [result_dir / f"{mode}_rank{r}.json" for r in range(world_size)]
    return [json.loads(p.read_text()) if p.exists() else None for p in paths]


def _write(result_dir: Path, mode: str, rank: int, payload: dict) -> None:
    path = result_dir / f"{mode}_rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def restart(result_dir: Path) -> None:
    """Ten DDP steps; on the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 exits abruptly at step 3, so
    torchrun --max-restarts=1 must restart both ranks, which then re-create the group and finish."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("tuned", timeout=GROUP_TIMEOUT)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(10):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        if attempt == 0 and rank == 1 and step == 3:
            os._exit(1)  # no cleanup at all, like a crash
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    _write(result_dir, "restart", rank, {"attempt": attempt, "rank": rank, "params": params})
    dist.destroy_process_group()


def concurrent(result_dir: Path, job: str) -> None:
    """Collectives whose results depend on the job id, so cross-talk between two concurrent jobs would show."""
    dist.init_process_group("tuned", timeout=GROUP_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    base = 1000.0 * int(job)
    for i in range(20):
        for numel in (1, 1000, 600_000):  # one-shot and two-shot all_reduce
            x = torch.full((numel,), base + rank + i)
            dist.all_reduce(x)
            expected = sum(base + r + i for r in range(world))
            assert torch.equal(x, torch.full((numel,), expected)), (job, i, numel, x[:4])
        y = torch.full((300,), base + rank)
        dist.broadcast(y, src=world - 1)
        assert torch.equal(y, torch.full((300,), base + world - 1)), (job, i, y[:4])
        outs = [torch.empty(5) for _ in range(world)]
        dist.all_gather(outs, torch.full((5,), base + rank + i))
        assert all(torch.equal(o, torch.full((5,), base + r + i)) for r, o in enumerate(outs)), (job, i)
    _write(result_dir, f"concurrent{job}", rank, {"ok": True})
    dist.destroy_process_group()


def shm_small(result_dir: Path) -> None:
    """The first collective needs more shared memory than /dev/shm has (TUNEDIST_SLOT_BYTES is set large)."""
    import tunedist._C as native

    dist.init_process_group("tuned", timeout=GROUP_TIMEOUT)
    rank = dist.get_rank()
    reserved = native.reserved_shm_bytes(dist.group.WORLD._get_backend(torch.device("cpu")))
    t0 = time.monotonic()
    message = None
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        message = str(exc)
    _write(result_dir, "shm_small", rank, {"message": message, "elapsed": time.monotonic() - t0,
                                           "reserved": reserved})
    dist.destroy_process_group()


MODES = {"restart": restart, "concurrent": concurrent, "shm_small": shm_small}

if __name__ == "__main__":
    torch.set_num_threads(1)
    MODES[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:])
