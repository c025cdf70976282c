"""How long the `tuned` backend takes to notice a dead peer (docs/performance.md#failure-detection).

Each trial starts 3 ranks (torch.multiprocessing, a file rendezvous, a 300 s group timeout). Rank 1 stalls inside
its second all_reduce at a chosen protocol step (the engine's TUNEDIST_TEST_STALL hook), rank 0 SIGKILLs it there,
and ranks 0 and 2 record the time from the kill to the error their own all_reduce raised. One-shot (4 KiB) and
pipelined two-shot (32 MiB, killed in its second chunk) are measured; the median and maximum over the survivors of
all trials are printed and, with --json, written.

With --pidns the victim runs in a pid namespace of its own (`unshare --pid --fork`, as a container that shares
/dev/shm with --ipc=host): its pid then means nothing to the survivors, so only its life lock (csrc/core/sync.h)
can tell them it died. Needs root (or user namespaces).

    python benchmarks/bench_dead_peer.py --trials 3 --json out.json [--pidns]
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
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import run_meta, write_json

# (elements, publish step rank 1 stalls before) for the operation with sequence number 2 (seq 1 is a warm-up).
CASES = {"one_shot": (1024, 1), "two_shot": (8 << 20, 3)}
VICTIM_SEQ = 2
GROUP_TIMEOUT_S = 300


def _outer_pid() -> int:
    """This process's pid in the outermost pid namespace (the first NSpid field), which the survivors can kill."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    return os.getpid()


def _rank(rank: int, world: int, init_file: str, numel: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    import tunedist  # noqa: F401,PLC0415  (registers "tuned")

    dist.init_process_group("tuned", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    store = dist.distributed_c10d._get_default_store()
    x = torch.full((numel,), float(rank + 1))
    dist.all_reduce(x)  # seq 1
    if rank == 1:
        store.set("victim_pid", str(_outer_pid()))
        dist.all_reduce(x)  # stalls before its publish and is killed there
        raise RuntimeError("bench_dead_peer: rank 1 finished an all_reduce it should have died in")
    if rank == 0:
        victim = int(store.get("victim_pid"))

        def kill_victim():
            time.sleep(1.0)  # rank 1 sits in its stall by now
            store.set("kill_time", repr(time.monotonic()))  # CLOCK_MONOTONIC is shared by the host's processes
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_victim, daemon=True).start()
    try:
        dist.all_reduce(x)
    except Exception as exc:  # noqa: BLE001 - the error is the measurement
        failed_at, message = time.monotonic(), str(exc)
    else:
        raise RuntimeError(f"bench_dead_peer: rank {rank}: all_reduce succeeded although rank 1 was killed")
    latency = failed_at - float(store.get("kill_time"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"latency_s": latency, "message": message.splitlines()[0]}, f)
    store.set(f"done_{rank}", "1")
    if rank == 0:  # rank 0 hosts the store: keep it until rank 2 has read the kill time
        store.wait(["done_2"])
    dist.destroy_process_group()


def run_trial(case: str, pidns: bool = False) -> list[dict]:
    numel, step = CASES[case]
    os.environ["TUNEDIST_TEST_STALL"] = f"1:{VICTIM_SEQ}:{step}:120000"
    try:
        with tempfile.TemporaryDirectory(prefix="tunedist_dead_peer_") as tmp:
            ctx = mp.get_context("spawn")
            init = os.path.join(tmp, "init")
            procs = {r: ctx.Process(target=_rank, args=(r, 3, init, numel, tmp)) for r in (0, 2)}
            if not pidns:
                procs[1] = ctx.Process(target=_rank, args=(1, 3, init, numel, tmp))
            for p in procs.values():
                p.start()
            victim = None
            if pidns:
                victim = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, os.path.abspath(__file__),
                                           "--victim", init, str(numel), tmp])
            for p in procs.values():
                p.join(GROUP_TIMEOUT_S)
            if pidns:
                # unshare --fork reports a child killed by a signal only as a failure (exit 1); that it was our
                # SIGKILL shows in the survivors' errors, checked below.
                victim.wait(GROUP_TIMEOUT_S)
            elif procs[1].exitcode != -signal.SIGKILL:
                raise RuntimeError(f"bench_dead_peer: rank 1 ended with {procs[1].exitcode}, not SIGKILL")
            results = []
            for r in (0, 2):
                if procs[r].exitcode != 0:
                    raise RuntimeError(f"bench_dead_peer: survivor rank {r} exited with {procs[r].exitcode}")
                with open(os.path.join(tmp, f"rank{r}.json")) as f:
                    results.append(json.load(f))
                if "rank 1" not in results[-1]["message"] or "dead" not in results[-1]["message"]:
                    raise RuntimeError(f"bench_dead_peer: rank {r} failed otherwise: {results[-1]['message']}")
            return results
    finally:
        os.environ.pop("TUNEDIST_TEST_STALL", None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per case (default 3)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--pidns", action="store_true", help="run the victim in a pid namespace of its own")
    parser.add_argument("--victim", nargs=3, metavar=("INIT", "NUMEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.victim:  # rank 1 inside `unshare --pid --fork` (run_trial with --pidns)
        _rank(1, 3, args.victim[0], int(args.victim[1]), args.victim[2])
        return 0
    report = {**run_meta(), "group_timeout_s": GROUP_TIMEOUT_S,
              "victim_pid_namespace": "own" if args.pidns else "shared", "cases": {}}
    for case in CASES:
        latencies, message = [], ""
        for _ in range(args.trials):
            for res in run_trial(case, args.pidns):
                latencies.append(res["latency_s"])
                message = res["message"]
        report["cases"][case] = {"latencies_s": latencies, "median_s": statistics.median(latencies),
                                 "max_s": max(latencies), "message": message}
        print(f"{case:9s} dead peer noticed {statistics.median(latencies) * 1e3:6.0f} ms (median), "
              f"{max(latencies) * 1e3:6.0f} ms (max) after SIGKILL over {len(latencies)} survivors; "
              f"group timeout {GROUP_TIMEOUT_S} s; victim's pid namespace: {report['victim_pid_namespace']}")
        print(f"          error: {message[:160]}")
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
