"""DDP training that loses a rank to `kill -9` and goes on with the survivors (dist.shrink_group on `tuned`).

    python examples/train_ddp_shrink.py [--world-size 3] [--kill-rank 1] [--kill-step 5] [--steps 12] [--json out]

The launcher (this script without --worker) hosts the job's TCP store, so the store outlives any rank (as
torchrun's agent store would; a `tcp://` group's store lives in its rank 0), starts one plain process per rank and
SIGKILLs rank --kill-rank once every rank has finished step --kill-step - 1. The survivors:

1. catch the error of the step they were in (tuned fails every peer of a dead rank at once, naming it);
2. find the dead ranks (each rank left its pid in the store; this example runs on one host, so /proc tells);
3. call dist.shrink_group(dead): a `tuned` group of the rest, ranks renumbered in their old order;
4. rebuild DDP on it and redo the failed step: every step's global batch (--global-batch samples) is split among
   the ranks there are, so the survivors take over the lost rank's share and every step still trains on the same
   samples with the same mean gradient;
5. go on to --steps.

At the end the survivors' parameters agree bit for bit (checked), and the launcher prints the time from the kill to
the first step completed on the shrunk group, and the final loss beside the same training without a failure
(--world-size ranks throughout, run first unless --no-reference): equal up to float rounding, since both runs
average the same per-sample gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

GROUP_TIMEOUT = timedelta(seconds=120)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--kill-rank", type=int, default=1, help="rank to SIGKILL (-1: none)")
    p.add_argument("--kill-step", type=int, default=5, help="the step in which it is killed")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--global-batch", type=int, default=48, help="samples per step, over all ranks")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--no-reference", action="store_true", help="skip the run without a failure")
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def global_batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def worker(args: argparse.Namespace) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tunedist  # noqa: F401  (registers "tuned")

    torch.set_num_threads(1)
    rank, port, out = int(args.worker[0]), int(args.worker[1]), Path(args.worker[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=GROUP_TIMEOUT)
    store.set(f"pid/{rank}", str(os.getpid()))
    dist.init_process_group("tuned", store=dist.PrefixStore("job/", store), rank=rank, world_size=args.world_size,
                            timeout=GROUP_TIMEOUT)
    module = make_model(args.width)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    model = DDP(module)
    old_ranks = list(range(args.world_size))  # old_ranks[new rank] = launch rank, after shrinking
    step, recovered = 0, None
    snapshot = [p.detach().clone() for p in module.parameters()]
    while step < args.steps:
        store.set(f"at/{step}/{rank}", "1")
        x, y = global_batch(step, args.global_batch)
        me, size = dist.get_rank(), dist.get_world_size()
        share = args.global_batch // size
        xs, ys = x[me * share:(me + 1) * share], y[me * share:(me + 1) * share]
        try:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs), ys).backward()
        except RuntimeError as e:
            # A peer died inside this step's all_reduce. A survivor may have finished the previous step's
            # all_reduce where another did not (the dead rank's part arrived at one and not the other): all agree
            # on the last step every survivor finished, and one that went past it takes back its last update.
            dead_launch_ranks = [r for r in old_ranks if not alive(int(store.get(f"pid/{r}")))]
            while not dead_launch_ranks:  # the error came before the kernel reaped it
                time.sleep(0.001)
                dead_launch_ranks = [r for r in old_ranks if not alive(int(store.get(f"pid/{r}")))]
            print(f"[launch rank {rank}] step {step}: {str(e).splitlines()[0][:160]}; launch ranks "
                  f"{dead_launch_ranks} are dead: shrinking", flush=True)
            dist.shrink_group([old_ranks.index(r) for r in dead_launch_ranks])
            old_ranks = [r for r in old_ranks if r not in dead_launch_ranks]
            agreed = torch.tensor([step])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            if int(agreed) < step:
                with torch.no_grad():
                    for p, saved in zip(module.parameters(), snapshot):
                        p.copy_(saved)
                step = int(agreed)
            model = DDP(module)  # on the new default group; it broadcasts rank 0's parameters, equal anyway
            recovered = "pending"
            continue  # the same step again, its global batch split among the survivors
        snapshot = [p.detach().clone() for p in module.parameters()]
        opt.step()
        if recovered == "pending":
            recovered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
        step += 1
    # The loss of the last global batch with the final parameters, which every rank computes alike.
    with torch.no_grad():
        x, y = global_batch(args.steps - 1, args.global_batch)
        final_loss = F.cross_entropy(module(x), y).item()
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    agree = all(torch.equal(c.view(torch.int32), flat.view(torch.int32)) for c in copies)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "launch_rank": rank, "rank": dist.get_rank(), "size": dist.get_world_size(), "final_loss": final_loss,
        "recovered_at": recovered if isinstance(recovered, float) else None, "params_agree": agree,
        "param_sum": float(flat.double().sum())}))
    dist.destroy_process_group()


def launch(args: argparse.Namespace, kill_rank: int) -> dict:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
    with tempfile.TemporaryDirectory(prefix="tunedist_shrink_") as tmp:
        base = [sys.executable, __file__, "--world-size", str(args.world_size), "--steps", str(args.steps),
                "--global-batch", str(args.global_batch), "--width", str(args.width)]
        procs = [subprocess.Popen(base + ["--worker", str(r), str(store.port), tmp]) for r in range(args.world_size)]
        killed_at = None
        if kill_rank >= 0:
            # Every rank has entered the kill step (so the victim is inside it too): kill -9.
            keys = [f"at/{args.kill_step}/{r}" for r in range(args.world_size)]
            while not all(store.check([k]) for k in keys):
                time.sleep(0.0005)
            killed_at = time.monotonic()
            procs[kill_rank].send_signal(signal.SIGKILL)
        codes = [p.wait() for p in procs]
        results = [json.loads((Path(tmp) / f"rank{r}.json").read_text())
                   for r in range(args.world_size) if r != kill_rank]
    for r, code in enumerate(codes):
        want = -signal.SIGKILL if r == kill_rank else 0
        if code != want:
            raise SystemExit(f"launch rank {r} exited with {code}")
    if not all(r["params_agree"] for r in results):
        raise SystemExit("the survivors' parameters differ")
    if len({r["param_sum"] for r in results}) != 1:
        raise SystemExit("the survivors' parameters differ")
    out = {"world_size": args.world_size, "kill_rank": kill_rank, "final_loss": results[0]["final_loss"],
           "param_sum": results[0]["param_sum"],
           "survivors": [(r["launch_rank"], r["rank"], r["size"]) for r in results]}
    if killed_at is not None:
        out["kill_to_first_shrunk_step_s"] = max(r["recovered_at"] for r in results) - killed_at
    return out


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    record = {"machine_cpus": os.cpu_count()}
    if not args.no_reference:
        record["reference"] = launch(args, -1)
        print(f"without a failure: final loss {record['reference']['final_loss']:.6f}")
    run = launch(args, args.kill_rank)
    record["shrink"] = run
    print(f"rank {args.kill_rank} of {args.world_size} SIGKILLed in step {args.kill_step}: survivors "
          f"(launch rank, new rank, size) {run['survivors']}; first step on the shrunk group completed "
          f"{run['kill_to_first_shrunk_step_s'] * 1e3:.0f} ms after the kill; final loss {run['final_loss']:.6f}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
