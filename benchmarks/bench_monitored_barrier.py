"""monitored_barrier, then destroy_process_group, repeated: how often a rank fails at the end of a job.

PyTorch's own pattern (two dist.monitored_barrier calls, then dist.destroy_process_group) run REPS times in plain
processes (one `python` per rank, no torch.multiprocessing). Every repetition makes a fresh group through
``tcp://127.0.0.1:<port>``, so rank 0 hosts that group's TCP store and closes it in destroy_process_group: a rank
still inside the barrier's store traffic at that moment fails ("Failed to recv, got 0 bytes"). The repetitions are
lined up at their start through a second store that lives for the whole run (rank 0 hosts it too), never at their
end, so nothing holds rank 0 back once its barrier returns.

    PYTHONPATH=python python benchmarks/bench_monitored_barrier.py --world-size 3 --reps 200 [--backend gloo]
        [--json out.json]

Prints one line per failed repetition (rank and message) and a summary: failures of REPS, and the median time of
one repetition. Exits 1 when a repetition failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

BARRIER_TIMEOUT = timedelta(seconds=60)
GROUP_TIMEOUT = timedelta(seconds=120)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, outer_port: int, reps: int, backend: str, out: Path) -> None:
    import torch  # noqa: PLC0415 - the launcher needs no torch
    import torch.distributed as dist  # noqa: PLC0415

    torch.set_num_threads(1)
    if backend == "tuned":
        import tunedist  # noqa: F401,PLC0415  (registers "tuned")

    outer = dist.TCPStore("127.0.0.1", outer_port, world, is_master=rank == 0, timeout=GROUP_TIMEOUT)
    records = []
    for i in range(reps):
        if rank == 0:
            outer.set(f"port/{i}", str(_free_port()))
        port = int(outer.get(f"port/{i}"))
        # Line up the start of the repetition only.
        outer.add(f"start/{i}", 1)
        while int(outer.add(f"start/{i}", 0)) < world:
            time.sleep(0.001)
        t0 = time.perf_counter()
        error = None
        try:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=GROUP_TIMEOUT)
            dist.monitored_barrier(timeout=BARRIER_TIMEOUT)
            dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=True)
        except Exception as e:  # noqa: BLE001 - every failure is the measurement
            error = f"{type(e).__name__}: {e}".splitlines()[0][:400]
        finally:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception as e:  # noqa: BLE001
                error = error or f"destroy_process_group: {type(e).__name__}: {e}".splitlines()[0][:400]
        records.append({"rep": i, "seconds": time.perf_counter() - t0, "error": error})
    # Rank 0 hosts the outer store: it leaves last.
    outer.add("finished", 1)
    while rank == 0 and int(outer.add("finished", 0)) < world:
        time.sleep(0.01)
    (out / f"rank{rank}.json").write_text(json.dumps(records))


def run(world: int, reps: int, backend: str) -> dict:
    """Runs the repetitions on `world` plain processes; returns the summary (failures, per-rank errors, times)."""
    with tempfile.TemporaryDirectory(prefix="tunedist_mb_") as tmp:
        out = Path(tmp)
        port = _free_port()
        logs = [out / f"rank{r}.log" for r in range(world)]
        procs = []
        for r in range(world):
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(world), str(port),
                                               str(reps), backend, str(out)], stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        stderr = [log.read_text() for log in logs]
        ranks = []
        for r in range(world):
            path = out / f"rank{r}.json"
            if not path.exists():
                raise RuntimeError(f"rank {r} exited with {codes[r]} without a result:\n{stderr[r][-4000:]}")
            ranks.append(json.loads(path.read_text()))
    failed = sorted({rec["rep"] for recs in ranks for rec in recs if rec["error"]})
    errors = [{"rep": rec["rep"], "rank": r, "error": rec["error"]}
              for r, recs in enumerate(ranks) for rec in recs if rec["error"]]
    seconds = [max(ranks[r][i]["seconds"] for r in range(world)) for i in range(reps)]
    return {"backend": backend, "world_size": world, "reps": reps, "failures": len(failed), "failed_reps": failed,
            "errors": errors, "median_rep_s": statistics.median(seconds), "exit_codes": codes}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, world, port, reps, backend, out = sys.argv[2:8]
        try:
            _worker(int(rank), int(world), int(port), int(reps), backend, Path(out))
        except BaseException:  # noqa: BLE001 - reported, then the exit code says it
            traceback.print_exc()
            return 1
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--backend", default="tuned")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = run(args.world_size, args.reps, args.backend)
    for e in result["errors"]:
        print(f"rep {e['rep']} rank {e['rank']}: {e['error']}")
    print(f"{result['backend']} world size {result['world_size']}: {result['failures']} of {result['reps']} "
          f"repetitions failed; median repetition {result['median_rep_s'] * 1e3:.1f} ms (cpus: {os.cpu_count()})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
