"""Recovery from `kill -9` of one rank: shrinking the group and taking a replacement back in through reconfigure
(examples/train_ddp_shrink.py) against a torchrun restart.

    python benchmarks/bench_recovery.py [--world-sizes 3,4] [--runs 5] [--standby]
                                                          [--json out.json]

Both recover the same DDP training (examples/train_ddp_shrink.py's model and data, launch rank 1 SIGKILLed once
every rank has entered step --kill-step) and report:

- shrink + reconfigure (the example, run with --no-reference): the time from the kill to the first step completed
  on the shrunk group (the survivors catch the error, call dist.shrink_group, rebuild DDP, redo the step); then,
  for the replacement the launcher starts once that step is done, the time from its start to the group back at
  full size (its reconfigure returned) and to the first step completed on the full group (every rank's), with
  where the replacement's time went: exec and imports, model (on the meta device, no initialisation), optimizer
  (its first use imports torch._dynamo), init_process_group, reconfigure, receiving the survivors' parameters and
  optimizer state, DDP, the first full step.
- with --standby, a second, separately reported mode: a standby replacement started with the job (imported, model
  and optimizer built, waiting in the store), called in at the moment the cold one would be started; its times
  run from that call.
- torchrun: `torchrun --max-restarts=1` with a checkpoint saved after every step (the anchor most jobs use):
  torchrun sees the dead worker, stops the others, starts all WORLD workers again, which import torch, join a new
  group, load the checkpoint and redo the step; the time from the kill to that step completed (the group is at full
  size again then too).

- with --floor: what any new Python process pays here before it can train, from its exec to the end of a
  `python -c` of: nothing; `import torch`; `import torch, tunedist`; `import torch` and one torch.optim.SGD (whose
  first use imports torch._dynamo). A cold replacement cannot step sooner than the last of these.

Prints the median and range of each over --runs runs per world size, and the load average beside them. No
/dev/shm name and no process is left (checked).
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


# What one run of the example reports (train_ddp_shrink.launch), in seconds; the replacement's stages are added as
# replacement_<stage>_s.
SHRINK_KEYS = ("kill_to_first_shrunk_step_s", "replacement_start_to_full_s", "replacement_start_to_first_full_step_s")


def _leftover_processes() -> list[str]:
    """Processes of this benchmark's jobs still running (the example's ranks, torchrun's workers)."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if EXAMPLE.name in cmd or "--torchrun-worker" in cmd:
            left.append(f"{d.name}: {cmd[:120]}")
    return left


def run_shrink(args: argparse.Namespace, world_size: int, out: Path, standby: bool = False) -> dict:
    subprocess.run([sys.executable, str(EXAMPLE), "--world-size", str(world_size), "--kill-rank", "1",
                    "--kill-step", str(args.kill_step), "--steps", str(args.steps), "--no-reference", "--json",
                    str(out), *(["--standby"] if standby else [])], check=True, stdout=subprocess.DEVNULL)
    run = json.loads(out.read_text())["shrink"]
    if run["final"] != [[r, r, world_size] for r in range(world_size) if r != 1] + [[1, 1, world_size]]:
        raise RuntimeError(f"the group did not end at full size: {run['final']}")
    return {**{k: run[k] for k in SHRINK_KEYS},
            **{f"replacement_{k}_s": v for k, v in run["replacement_stages_s"].items()}}


def torchrun_worker(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415 - the launcher imports no torch
    import torch.distributed as dist  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415
    from train_ddp_shrink import global_batch, make_model, make_optimizer  # noqa: PLC0415

    import tunedist  # noqa: F401,PLC0415  (registers "tuned")

    torch.set_num_threads(1)
    work = Path(args.torchrun_worker)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("tuned", timeout=timedelta(seconds=120))
    module = make_model(args.width)
    opt = make_optimizer(module)
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


def run_torchrun(args: argparse.Namespace, world_size: int, work: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "--max-restarts=1", "--monitor-interval=0.1", __file__, "--torchrun-worker", str(work),
           "--steps", str(args.steps), "--global-batch", str(args.global_batch), "--width", str(args.width)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        keys = [work / f"at_0_{args.kill_step}_{r}" for r in range(world_size)]
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


# --floor: each `python -c` program, ended by printing time.monotonic() (one clock for every process of the host).
FLOOR_PROGRAMS = {
    "python": "pass",
    "import_torch": "import torch",
    "import_torch_tunedist": "import torch, tunedist",
    "import_torch_first_optimizer": "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)",
}


def time_floor(runs: int) -> dict:
    """Seconds from exec to the end of each FLOOR_PROGRAMS program, `runs` times each, interleaved."""
    times: dict[str, list[float]] = {k: [] for k in FLOOR_PROGRAMS}
    for _ in range(runs):
        for name, program in FLOOR_PROGRAMS.items():
            start = time.monotonic()
            out = subprocess.run([sys.executable, "-c", f"{program}\nimport time; print(repr(time.monotonic()))"],
                                 check=True, capture_output=True, text=True).stdout
            times[name].append(float(out.strip().splitlines()[-1]) - start)
    return {k: _spread(v) for k, v in times.items()}


def _spread(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "runs_s": values}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", default="3,4",
                   help="comma-separated; launch rank 1 is killed in each (empty: none, e.g. with --floor alone)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--standby", action="store_true",
                   help="also time a standby replacement (started with the job, called in when a rank dies)")
    p.add_argument("--floor", action="store_true",
                   help="also time exec to `import torch` and to torch.optim's first use in a bare process")
    p.add_argument("--json", type=Path)
    p.add_argument("--torchrun-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torchrun_worker:
        torchrun_worker(args)
        return 0
    before = _shm()
    record = {"cpu": _cpu_model(), "cpus": os.cpu_count(), "kill_step": args.kill_step, "steps": args.steps,
              "runs": args.runs, "world_sizes": {}}
    for world_size in [int(w) for w in args.world_sizes.split(",") if w]:
        runs: list[dict] = []
        for i in range(args.runs):
            load_before = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="tunedist_recovery_") as tmp:
                shrink = run_shrink(args, world_size, Path(tmp) / "shrink.json")
                standby = {}
                if args.standby:
                    standby = {f"standby_{k}": v for k, v in
                               run_shrink(args, world_size, Path(tmp) / "standby.json", standby=True).items()
                               if k.startswith("replacement_")}
                work = Path(tmp) / "torchrun"
                work.mkdir()
                torchrun = run_torchrun(args, world_size, work)
            runs.append({**shrink, **standby, "torchrun_kill_to_first_step_s": torchrun,
                         "load_1min": [load_before, os.getloadavg()[0]]})
            stages = ", ".join(f"{k[len('replacement_'):-2]} {v * 1e3:.0f}" for k, v in shrink.items()
                               if k.startswith("replacement_") and k not in SHRINK_KEYS)
            print(f"world size {world_size}, run {i + 1}: kill -> first shrunk step "
                  f"{shrink['kill_to_first_shrunk_step_s'] * 1e3:.0f} ms; cold replacement start -> full group "
                  f"{shrink['replacement_start_to_full_s'] * 1e3:.0f} ms, -> first full step "
                  f"{shrink['replacement_start_to_first_full_step_s'] * 1e3:.0f} ms ({stages} ms)"
                  + (f"; standby replacement call -> first full step "
                     f"{standby['standby_replacement_start_to_first_full_step_s'] * 1e3:.0f} ms" if standby else "")
                  + f"; torchrun restart {torchrun * 1e3:.0f} ms; load {load_before:.1f}", flush=True)
        keys = [k for k in runs[0] if k.endswith("_s")]
        summary = {k: _spread([r[k] for r in runs]) for k in keys}
        loads = [x for r in runs for x in r["load_1min"]]
        record["world_sizes"][str(world_size)] = {"summary": summary, "runs": runs,
                                                  "load_1min_range": [min(loads), max(loads)]}
        for k in keys:
            v = summary[k]
            print(f"world size {world_size}, {k}: {v['median_s'] * 1e3:.0f} ms median "
                  f"({v['min_s'] * 1e3:.0f}-{v['max_s'] * 1e3:.0f} ms), {args.runs} runs")
    if args.floor:
        load_before = os.getloadavg()[0]
        record["floor"] = time_floor(args.runs)
        record["floor_load_1min"] = [load_before, os.getloadavg()[0]]
        for k, v in record["floor"].items():
            print(f"a new process, exec -> end of {FLOOR_PROGRAMS[k]!r}: {v['median_s'] * 1e3:.0f} ms median "
                  f"({v['min_s'] * 1e3:.0f}-{v['max_s'] * 1e3:.0f} ms), {args.runs} runs; load {load_before:.1f}")
    print(f"{record['cpus']} CPUs ({record['cpu']})")
    left = _shm() - before
    procs = _leftover_processes()
    record["left_in_dev_shm"], record["processes_left"] = sorted(left), procs
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    if left or procs:
        print(f"left in /dev/shm: {sorted(left)}; processes left: {procs}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
