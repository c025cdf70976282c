"""Recovery from `kill -9` of one rank: shrinking the group (examples/train_ddp_shrink.py) against a torchrun restart.

    PYTHONPATH=python python benchmarks/bench_recovery.py [--world-size 3] [--runs 3] [--json out.json]

Both recover the same DDP training (examples/train_ddp_shrink.py's model and data, one rank SIGKILLed once every
rank has entered step --kill-step) and report the time from the kill to the first training step completed after
it:

- shrink: the survivors catch the error, call dist.shrink_group, rebuild DDP and redo the step on WORLD-1 ranks
  (the example, run with --no-reference).
- torchrun: `torchrun --max-restarts=1` with a checkpoint saved after every step (the anchor most jobs use):
  torchrun sees the dead worker, stops the others, starts all WORLD workers again, which import torch, join a new
  group, load the checkpoint and redo the step.

Prints the median and range of each over --runs runs. No /dev/shm name and no process is left (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp_shrink.py"
sys.path.insert(0, str(EXAMPLE.parent))


def _shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("tunedist_")}


def run_shrink(args: argparse.Namespace, out: Path) -> float:
    subprocess.run([sys.executable, str(EXAMPLE), "--world-size", str(args.world_size), "--kill-rank", "1",
                    "--kill-step", str(args.kill_step), "--steps", str(args.steps), "--no-reference", "--json",
                    str(out)], check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["shrink"]["kill_to_first_shrunk_step_s"]


def torchrun_worker(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415 - the launcher imports no torch
    import torch.distributed as dist  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415
    from train_ddp_shrink import global_batch, make_model  # noqa: PLC0415

    import tunedist  # noqa: F401,PLC0415  (registers "tuned")

    torch.set_num_threads(1)
    work = Path(args.torchrun_worker)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("tuned", timeout=timedelta(seconds=120))
    module = make_model(args.width)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    step = 0
    ckpt = work / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt)
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    model = DDP(module)
    (work / f"pid{rank}").write_text(str(os.getpid()))
    first = True
    while step < args.steps:
        (work / f"at_{attempt}_{step}_{rank}").touch()
        x, y = global_batch(step, args.global_batch)
        share = args.global_batch // world
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[rank * share:(rank + 1) * share]), y[rank * share:(rank + 1) * share]).backward()
        opt.step()
        step += 1
        if rank == 0:
            tmp = work / "ckpt.tmp"
            torch.save({"model": module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        dist.barrier()  # the checkpoint of this step is complete before any rank starts the next
        if attempt > 0 and first and rank == 0:
            (work / "recovered").write_text(repr(time.monotonic()))
        first = False
    dist.destroy_process_group()


def run_torchrun(args: argparse.Namespace, work: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.world_size}",
           "--max-restarts=1", "--monitor-interval=0.1", __file__, "--torchrun-worker", str(work),
           "--steps", str(args.steps), "--global-batch", str(args.global_batch), "--width", str(args.width)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        keys = [work / f"at_0_{args.kill_step}_{r}" for r in range(args.world_size)]
        while not all(k.exists() for k in keys):
            if proc.poll() is not None:
                raise RuntimeError(f"torchrun exited with {proc.returncode} before the kill")
            time.sleep(0.0005)
        killed_at = time.monotonic()
        os.kill(int((work / "pid1").read_text()), signal.SIGKILL)
        code = proc.wait()
        if code != 0:
            raise RuntimeError(f"torchrun exited with {code}")
        return float((work / "recovered").read_text()) - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--json", type=Path)
    p.add_argument("--torchrun-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torchrun_worker:
        torchrun_worker(args)
        return 0
    before = _shm()
    times: dict[str, list[float]] = {"shrink": [], "torchrun": []}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tunedist_recovery_") as tmp:
            times["shrink"].append(run_shrink(args, Path(tmp) / "shrink.json"))
            work = Path(tmp) / "torchrun"
            work.mkdir()
            times["torchrun"].append(run_torchrun(args, work))
        print(f"run {i + 1}: shrink {times['shrink'][-1] * 1e3:.0f} ms, torchrun restart "
              f"{times['torchrun'][-1] * 1e3:.0f} ms", flush=True)
    left = _shm() - before
    summary = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "runs_s": v}
               for k, v in times.items()}
    for k, v in summary.items():
        print(f"{k}: kill -> first completed step {v['median_s'] * 1e3:.0f} ms median "
              f"({v['min_s'] * 1e3:.0f}-{v['max_s'] * 1e3:.0f} ms), {args.runs} runs, world size {args.world_size}, "
              f"{os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"world_size": args.world_size, "kill_step": args.kill_step,
                                         "cpus": os.cpu_count(), "summary": summary}, indent=1))
    if left:
        print(f"left in /dev/shm: {sorted(left)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
