"""DDP training that loses a rank to `kill -9`, goes on with the survivors (dist.shrink_group on `tuned`), and
takes a replacement process back in (torch's reconfigure), so the group is back to full size.

    python examples/train_ddp_shrink.py [--world-size 3] [--kill-rank 1] [--kill-step 5] [--steps 12]
                                        [--no-replacement] [--standby] [--json out]

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

Once the survivors have completed a step on the shrunk group, the launcher starts a replacement process (unless
--no-replacement), given the dead rank's rank. It creates its group in the reconfigure regime
(init_process_group(..., enable_reconfigure=True): no members yet, nothing waits) and leaves its reconfigure handle
and a fresh uuid in the store. At the next step boundary the survivors agree that it is there (one all_reduce of a
flag per step while the group is short), leave their own handles, and everyone calls
dist.distributed_c10d._reconfigure(uuid, handles) with the set of handles: `tuned` orders a set by the rank each
process joined with first, so the replacement takes the dead rank's place. The survivors hand it the step, the
parameters and the optimizer's state (broadcasts from a survivor), DDP is rebuilt on the full group (without its
own broadcast: the parameters are equal already), and training goes on with the global batch split among all
--world-size ranks again. The replacement builds its model on the meta device and gives it uninitialised memory:
what it would initialise is overwritten by the survivors' parameters anyway. It builds its optimizer before it
asks to join, so it can step as soon as it is in: torch.optim's first use imports torch._dynamo, about 1.1 s on a
2-vCPU AMD EPYC, which with `import torch` (about 1.3 s) bounds how soon a process started cold can step.

With --standby the launcher starts the replacement with the job instead: it imports torch, builds its model and
optimizer and waits in the store; when a rank dies it is called in with that rank and joins as above.

At the end every rank's parameters agree bit for bit (checked), and the launcher prints the time from the kill to
the first step completed on the shrunk group, from the replacement's start (or call, --standby) to the group back
at full size and to the first step completed on it by every rank, where the replacement's time went, and the final
loss beside the same training without a failure (--world-size ranks
throughout, run first unless --no-reference): equal up to float rounding, since every run averages the same
per-sample gradients.
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
    p.add_argument("--no-replacement", action="store_true", help="the survivors finish alone")
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--standby", action="store_true",
                   help="start the replacement with the job (imported, model and optimizer built, waiting) and "
                        "call it in when a rank dies, instead of starting it then")
    p.add_argument("--replacement", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def make_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=0.05)


def global_batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def dead_ranks(store, launch_ranks: list[int]) -> list[int]:
    """The launch ranks among `launch_ranks` whose process is gone (each left its pid in the store)."""
    while True:
        dead = [r for r in launch_ranks if not alive(int(store.get(f"pid/{r}")))]
        if dead:
            return dead
        time.sleep(0.001)  # the error came before the kernel reaped it


def take_in_replacement(store, rank: int, launch_ranks: list[int], world_size: int) -> list[int]:
    """On a survivor: the group back to full size with the replacement that left its handle and uuid."""
    c10d = dist.distributed_c10d
    uuid = int(store.get("join/uuid"))
    store.set(f"join/{uuid}/{rank}", c10d._get_reconfigure_handle())
    handles = {store.get(f"join/{uuid}/{r}").decode() for r in launch_ranks}
    handles.add(store.get("join/handle").decode())
    c10d._reconfigure(uuid, handles).wait()
    return list(range(world_size))


def join_as_replacement(store, rank: int) -> None:
    """The replacement: a group in the reconfigure regime, its handle and a fresh uuid in the store, then the
    reconfigure with everyone's handles."""
    c10d = dist.distributed_c10d
    uuid = int.from_bytes(os.urandom(7), "little")  # fresh for this membership
    store.set("join/uuid", str(uuid))
    store.set("join/handle", c10d._get_reconfigure_handle())
    survivors = [r for r in range(dist.get_world_size()) if r != rank]
    handles = {store.get(f"join/{uuid}/{r}").decode() for r in survivors}
    handles.add(c10d._get_reconfigure_handle())
    c10d._reconfigure(uuid, handles).wait()


def receive_state(module: nn.Module, opt: torch.optim.Optimizer, src: int, step: int) -> int:
    """The step, the parameters and the optimizer's state of group rank `src`, on every rank (one broadcast of the
    flat parameters, one of the pickled optimizer state). Returns the step."""
    params = list(module.parameters())
    flat = torch.cat([torch.tensor([float(step)])] + [p.detach().reshape(-1) for p in params])
    dist.broadcast(flat, src)
    offset = 1
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    state = [opt.state_dict()]
    dist.broadcast_object_list(state, src)
    opt.load_state_dict(state[0])
    return int(flat[0])


def worker(args: argparse.Namespace) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import tunedist  # noqa: F401  (registers "tuned")

    torch.set_num_threads(1)
    stamps = {"imported": time.monotonic()}  # Python, torch and tunedist imported
    rank, port, out = int(args.worker[0]), int(args.worker[1]), Path(args.worker[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=GROUP_TIMEOUT)
    if args.replacement:
        # No random initialisation: the survivors' parameters and optimizer state replace whatever is here, so
        # the model is made on the meta device and given uninitialised memory.
        with torch.device("meta"):
            module = make_model(args.width)
        module.to_empty(device="cpu")
    else:
        module = make_model(args.width)
    stamps["model"] = time.monotonic()
    # Before joining: the optimizer's first use imports torch._dynamo (torch.optim's methods are wrapped in
    # torch._disable_dynamo), about 1.1 s on a 2-vCPU AMD EPYC, and a replacement must be able to step once it joins.
    opt = make_optimizer(module)
    stamps["optimizer"] = time.monotonic()
    if args.standby:
        # A standby replacement: imported and built ahead of need; the launcher names the rank to take when one dies.
        store.wait(["standby/go"], timedelta(hours=1))
        rank = int(store.get("standby/go"))
        stamps["called"] = time.monotonic()
    init_at = time.monotonic()
    dist.init_process_group("tuned", store=dist.PrefixStore("job/", store), rank=rank, world_size=args.world_size,
                            timeout=GROUP_TIMEOUT, enable_reconfigure=args.replacement)
    launch_ranks = list(range(args.world_size))  # launch_ranks[group rank] = launch rank
    step, recovered, full_at, full_step_at = 0, None, None, None
    shrunk = (None, None)
    expect_replacement = not args.no_replacement and not args.replacement
    if args.replacement:
        join_as_replacement(store, rank)
        full_at = time.monotonic()
    store.set(f"pid/{rank}", str(os.getpid()))  # a replacement's pid replaces the dead rank's
    if args.replacement:
        # A survivor's step, parameters and optimizer state (every survivor has them).
        src = next(r for r in range(args.world_size) if r != rank)
        step = receive_state(module, opt, src, 0)
        stamps["state"] = time.monotonic()
        full_step_at = "pending"
    # The parameters are equal on every rank here (initialised from one seed, or just received): DDP need not
    # broadcast them again.
    model = DDP(module, init_sync=False)
    stamps["ddp"] = time.monotonic()
    snapshot = [p.detach().clone() for p in module.parameters()]
    while step < args.steps:
        store.set(f"at/{step}/{rank}", "1")
        if expect_replacement and len(launch_ranks) < args.world_size and isinstance(recovered, float):
            if step == args.steps - 1:
                store.wait(["join/handle"])  # the run ends on the full group: its last step waits for the replacement
            # Is the replacement there? Every survivor must answer alike, so they agree with an all_reduce.
            there = torch.tensor([int(store.check(["join/handle"]))])
            dist.all_reduce(there, op=dist.ReduceOp.MAX)
            if int(there):
                src = launch_ranks[0]  # the first survivor keeps its launch rank as its rank in the full group
                launch_ranks = take_in_replacement(store, rank, launch_ranks, args.world_size)
                full_at = time.monotonic()
                receive_state(module, opt, src, step)
                model = DDP(module, init_sync=False)  # equal parameters everywhere: received just now
                full_step_at = "pending"
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
            dead = dead_ranks(store, launch_ranks)
            print(f"[launch rank {rank}] step {step}: {str(e).splitlines()[0][:160]}; launch ranks "
                  f"{dead} are dead: shrinking", flush=True)
            dist.shrink_group([launch_ranks.index(r) for r in dead])
            launch_ranks = [r for r in launch_ranks if r not in dead]
            shrunk = (dist.get_rank(), dist.get_world_size())
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
            if dist.get_rank() == 0:
                store.set("shrunk/first_step", "1")  # the launcher starts the replacement now
        if full_step_at == "pending":
            full_step_at = time.monotonic()
        step += 1
    # The loss of the last global batch with the final parameters, which every rank computes alike.
    with torch.no_grad():
        x, y = global_batch(args.steps - 1, args.global_batch)
        final_loss = F.cross_entropy(module(x), y).item()
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    agree = all(torch.equal(c.view(torch.int32), flat.view(torch.int32)) for c in copies)
    def stamp(t):
        return t if isinstance(t, float) else None

    (out / f"rank{rank}{'r' if args.replacement else ''}.json").write_text(json.dumps({
        "launch_rank": rank, "replacement": args.replacement, "rank": dist.get_rank(), "size": dist.get_world_size(),
        "shrunk_rank": shrunk[0], "shrunk_size": shrunk[1], "final_loss": final_loss,
        "recovered_at": stamp(recovered), "stamps": stamps, "init_at": init_at, "full_at": full_at,
        "full_step_at": stamp(full_step_at),
        "params_agree": agree, "param_sum": float(flat.double().sum())}))
    dist.destroy_process_group()


def wait_for_keys(store, keys: list[str], procs: list[subprocess.Popen]) -> None:
    """Polls until every key is in the store; a rank that exits meanwhile ends the run (it would never come)."""
    while not all(store.check([k]) for k in keys):
        ended = [(p.args[p.args.index("--worker") + 1], p.returncode) for p in procs if p.poll() is not None]
        if ended:
            raise SystemExit(f"ranks (launch rank, exit code) {ended} ended before {keys} were set")
        time.sleep(0.0005)


def launch(args: argparse.Namespace, kill_rank: int) -> dict:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
    replace = kill_rank >= 0 and not args.no_replacement
    with tempfile.TemporaryDirectory(prefix="tunedist_shrink_") as tmp:
        base = [sys.executable, __file__, "--world-size", str(args.world_size), "--steps", str(args.steps),
                "--global-batch", str(args.global_batch), "--width", str(args.width)]
        if not replace:
            base.append("--no-replacement")
        procs = [subprocess.Popen(base + ["--worker", str(r), str(store.port), tmp]) for r in range(args.world_size)]
        if replace and args.standby:
            procs.append(subprocess.Popen(base + ["--worker", "-1", str(store.port), tmp, "--replacement",
                                                  "--standby"]))
        killed_at = started_at = None
        try:
            if kill_rank >= 0:
                # Every rank has entered the kill step (so the victim is inside it too): kill -9.
                wait_for_keys(store, [f"at/{args.kill_step}/{r}" for r in range(args.world_size)], procs)
                killed_at = time.monotonic()
                procs[kill_rank].send_signal(signal.SIGKILL)
            if replace:
                # Once the survivors have completed a step without it: the replacement, given the dead rank's rank
                # (started now, or the standby called in).
                wait_for_keys(store, ["shrunk/first_step"], [q for i, q in enumerate(procs) if i != kill_rank])
                started_at = time.monotonic()
                if args.standby:
                    store.set("standby/go", str(kill_rank))
                else:
                    procs.append(subprocess.Popen(base + ["--worker", str(kill_rank), str(store.port), tmp,
                                                          "--replacement"]))
            codes = [p.wait() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        names = [f"rank{r}.json" for r in range(args.world_size) if r != kill_rank]
        results = [json.loads((Path(tmp) / name).read_text()) for name in names]
        joined = json.loads((Path(tmp) / f"rank{kill_rank}r.json").read_text()) if replace else None
    for r, code in enumerate(codes):
        want = -signal.SIGKILL if r == kill_rank else 0
        if code != want:
            raise SystemExit(f"{'the replacement' if r == args.world_size else f'launch rank {r}'} exited with {code}")
    everyone = results + ([joined] if joined else [])
    if not all(r["params_agree"] for r in everyone) or len({r["param_sum"] for r in everyone}) != 1:
        raise SystemExit("the ranks' parameters differ")
    out = {"world_size": args.world_size, "kill_rank": kill_rank, "final_loss": results[0]["final_loss"],
           "param_sum": results[0]["param_sum"],
           "survivors": [(r["launch_rank"], r["shrunk_rank"], r["shrunk_size"]) for r in results],
           "final": [(r["launch_rank"], r["rank"], r["size"]) for r in everyone]}
    if killed_at is not None:
        out["kill_to_first_shrunk_step_s"] = max(r["recovered_at"] for r in results) - killed_at
    if joined:
        st = joined["stamps"]
        out["replacement_mode"] = "standby" if args.standby else "cold"
        out["replacement_start_to_full_s"] = joined["full_at"] - started_at
        out["replacement_start_to_first_full_step_s"] = max(r["full_step_at"] for r in everyone) - started_at
        # Where the replacement's time went, in order (a standby's imports, model and optimizer came before its
        # call, which is its start here).
        stages = {} if args.standby else {"exec_and_imports": st["imported"] - started_at,
                                          "model": st["model"] - st["imported"],
                                          "optimizer": st["optimizer"] - st["model"]}
        stages.update({"init_process_group": joined["init_at"] - (st["called"] if args.standby else st["optimizer"]),
                       "reconfigure": joined["full_at"] - joined["init_at"],
                       "receive_state": st["state"] - joined["full_at"], "ddp": st["ddp"] - st["state"],
                       "first_full_step": max(r["full_step_at"] for r in everyone) - st["ddp"]})
        if args.standby:
            stages = {"call": st["called"] - started_at, **stages}
        out["replacement_stages_s"] = stages
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
    if "replacement_start_to_full_s" in run:
        stages = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in run["replacement_stages_s"].items())
        print(f"{run['replacement_mode']} replacement for launch rank {args.kill_rank}: group back to "
              f"{args.world_size} ranks {run['replacement_start_to_full_s'] * 1e3:.0f} ms after its start, first "
              f"full step completed {run['replacement_start_to_first_full_step_s'] * 1e3:.0f} ms after it ({stages} "
              f"ms); ranks at the end (launch rank, rank, size) {run['final']}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
