"""Where the time of one CPU `dist.all_reduce` goes, per size: a per-call budget beside the c10d floor; the same for
`tunedist.all_reduce` (the operator, no torch.distributed Python) beside the operator floor.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_call_budget.py --json budget.json

Every row is measured in this one run, interleaved (round r: size 1: row A, B, C ...; size 2: ...), so load drift
hits all rows alike. A row's figure is the median over rounds of its per-round median µs per call.
  fake        dist.all_reduce on torch's fake process group (torch.testing._internal.distributed.fake_pg), which
              moves nothing: Python, the c10d dispatcher and a Work. The floor any c10d backend pays.
  tuned_ws1   dist.all_reduce on a world-size-1 `tuned` group (one per rank): the floor plus tunedist's own cost per
              call (checks, the executor, one round of the engine without peers; no Work: see below).
  tuned_ws1_async   the same with async_op=True and work.wait(). A group of one rank runs async calls inline
              (nobody to wait for), so this is the Work's own cost; tuned_async shows the hand-off to the worker.
  tuned       dist.all_reduce on the job's `tuned` group (all ranks): the above plus synchronisation and the bytes.
  tuned_async       the same with async_op=True and work.wait(): the worker thread's hand-off on top.
  gloo        the same on gloo, for scale.
  op_floor    torch.ops._c10d_functional.wait_tensor on a tensor with no pending collective: a torch operator called
              from Python that finds nothing to do. The floor of any operator-based all_reduce (DeepSpeed's too).
  tuned_op_ws1      tunedist.all_reduce on the world-size-1 `tuned` group: that floor plus tunedist's own cost.
  tuned_op    tunedist.all_reduce on the job's `tuned` group.
  deepspeed   deepspeed.comm.inference_all_reduce (its shared-memory all_reduce; tunedist.bench.contenders), when
              DeepSpeed is installed: the peer to beat (float32 SUM runs its shm kernel).
  deepspeed_op      its kernel, torch.ops.deepspeed.inference_all_reduce_, called without its Python API.
  kernels     the engine's own copy (into a slot, cached stores as the engine makes it) and reduce (P sources) of
              S bytes, timed in C++ on warm buffers (tunedist._C.measure_kernels_us): what the bytes cost at this
              machine's cache and memory speed. What moving them between cores adds shows under synchronisation.
The budget splits `tuned` into: floor (fake), tunedist per call (tuned_ws1 - fake), bytes (kernels) and
synchronisation (the rest: tuned - tuned_ws1 - kernels + the ws1 self-copy, never below zero); and `tuned_op` the
same way with op_floor and tuned_op_ws1. The fake group hands torch a Work, which Python then waits on; a synchronous
`tuned` call that runs inline hands back none (TUNEDIST_SYNC_WORK), so tunedist's part can come out below zero: it
costs less than the Work that the floor includes.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist
from _common import load_avg, parse_sizes, per_call_us, process_group, run_meta, write_json

import tunedist
from tunedist.bench import contenders

DEFAULT_SIZES = "4K,64K,1M,4M"


def iters_for(nbytes: int) -> int:
    return max(20, min(2000, (64 << 20) // max(nbytes, 1) // 8))


def make_rows(args, groups, t: torch.Tensor, ds) -> dict:
    rows = {
        "fake": lambda: dist.all_reduce(t, group=groups["fake"]),
        "tuned_ws1": lambda: dist.all_reduce(t, group=groups["tuned_ws1"]),
        "tuned_ws1_async": lambda: dist.all_reduce(t, group=groups["tuned_ws1"], async_op=True).wait(),
        "tuned": lambda: dist.all_reduce(t, group=groups["tuned"]),
        "tuned_async": lambda: dist.all_reduce(t, group=groups["tuned"], async_op=True).wait(),
    }
    if not args.no_gloo:
        rows["gloo"] = lambda: dist.all_reduce(t, group=groups["gloo"])
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default
    rows["op_floor"] = lambda: wait_tensor(t)
    rows["tuned_op_ws1"] = lambda: tunedist.all_reduce(t, group=groups["tuned_ws1"])
    rows["tuned_op"] = lambda: tunedist.all_reduce(t, group=groups["tuned"])
    if ds is not None:
        rows["deepspeed"] = lambda: ds.all_reduce(t, dist.ReduceOp.SUM)
        if ds.info["shm_op"]:
            kernel = torch.ops.deepspeed.inference_all_reduce_
            rows["deepspeed_op"] = lambda: kernel(t)
    return rows


def measure(args, ds) -> dict:
    world = dist.get_world_size()
    groups = {
        "fake": dist.new_subgroups(group_size=1, backend="fake")[0],
        "tuned_ws1": dist.new_subgroups(group_size=1, backend="tuned")[0],
        "tuned": dist.new_group(backend="tuned"),
    }
    if not args.no_gloo:
        groups["gloo"] = dist.new_group(backend="gloo")
    sizes = args.sizes
    samples: dict = {s: {} for s in sizes}
    kernels: dict = {s: [] for s in sizes}
    for _ in range(args.rounds):
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            rows = make_rows(args, groups, t, ds)
            iters = iters_for(nbytes)
            for name, call in rows.items():
                for _ in range(3):
                    call()  # warm: the group's first call attaches its shared memory
                dist.barrier()
                t.fill_(1.0)
                samples[nbytes].setdefault(name, []).append(per_call_us(call, iters))
            kernels[nbytes].append(tunedist._C.measure_kernels_us(nbytes, world, 9))
            t.fill_(1.0)
            for name, call in rows.items():  # every row's result, once per size and round (outside the timing)
                call()
                # fake and the floor move nothing; a world-size-1 group has nothing to add
                want = 1.0 if name in ("fake", "tuned_ws1", "tuned_ws1_async", "op_floor", "tuned_op_ws1") else world
                assert bool((t == want).all()), f"{name} all_reduce of {nbytes} B gave a wrong result"
                t.fill_(1.0)
    return {"world_size": world, "sizes": sizes, "samples": samples, "kernels": kernels}


def summarize(raw: dict) -> list:
    out = []
    for nbytes in raw["sizes"]:
        med = {name: statistics.median(v) for name, v in raw["samples"][nbytes].items()}
        spread = {name: (min(v), max(v)) for name, v in raw["samples"][nbytes].items()}
        copy_us = statistics.median(k["copy_us"] for k in raw["kernels"][nbytes])
        reduce_us = statistics.median(k["reduce_us"] for k in raw["kernels"][nbytes])
        self_copy_us = statistics.median(k["self_copy_us"] for k in raw["kernels"][nbytes])
        bytes_us = copy_us + reduce_us
        out.append({"bytes": nbytes, "median_us": med, "min_max_us": spread,
                    "kernels_us": {"copy": copy_us, "reduce": reduce_us, "ws1_self_copy": self_copy_us},
                    "budget_us": _budget(med, "fake", "tuned_ws1", "tuned", bytes_us, self_copy_us),
                    "op_budget_us": _budget(med, "op_floor", "tuned_op_ws1", "tuned_op", bytes_us, self_copy_us)})
    return out


def _budget(med: dict, floor: str, ws1: str, total: str, bytes_us: float, self_copy_us: float) -> dict:
    """Row `total` split over the floor row, tunedist's own cost (the world-size-1 row over the floor), the bytes and
    the rest (synchronisation; the world-size-1 row's self-copy given back)."""
    return {"floor": med[floor], "tunedist_per_call": med[ws1] - med[floor], "bytes": bytes_us,
            "synchronisation": max(0.0, med[total] - med[ws1] + self_copy_us - bytes_us), "total": med[total]}


def print_table(rows: list, raw: dict, load: tuple) -> None:
    names = list(rows[0]["median_us"])
    rounds = len(raw["samples"][rows[0]["bytes"]][names[0]])
    print(f"# world size {raw['world_size']}, float32 SUM, median µs per call over {rounds} interleaved rounds; "
          f"load {load[0]:.2f} -> {load[1]:.2f}")
    print(f"#{'size':>9} " + " ".join(f"{n:>16}" for n in names))
    for r in rows:
        print(f"{r['bytes']:>10} " + " ".join(f"{r['median_us'][n]:>16.2f}" for n in names))
    for key, what, floor in (("budget_us", "tuned (dist.all_reduce)", "c10d floor"),
                             ("op_budget_us", "tuned_op (tunedist.all_reduce)", "operator floor")):
        print(f"#\n# budget of {what}, µs: {floor} | tunedist per call | bytes (copy + reduce kernels) | "
              f"synchronisation")
        for r in rows:
            b = r[key]
            print(f"{r['bytes']:>10}  {b['floor']:8.2f} | {b['tunedist_per_call']:8.2f} | {b['bytes']:8.2f} "
                  f"({r['kernels_us']['copy']:.2f} + {r['kernels_us']['reduce']:.2f}) | {b['synchronisation']:8.2f}"
                  f"   = {b['total']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                   help=f"comma-separated bytes (default {DEFAULT_SIZES})")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-gloo", action="store_true")
    p.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeed out even when it is installed")
    p.add_argument("--json")
    args = p.parse_args(argv)
    import torch.testing._internal.distributed.fake_pg  # noqa: F401,PLC0415  (registers the "fake" backend)

    use_ds = not args.no_deepspeed and contenders.deepspeed_problem("cpu") is None
    with process_group("gloo") as (rank, _):
        ds = contenders.make("deepspeed").comm if use_ds else None
        load0 = load_avg()[0]
        raw = measure(args, ds)
        load = (load0, load_avg()[0])
        rows = summarize(raw)
        if rank == 0:
            print_table(rows, raw, load)
            if args.json:
                write_json(args.json, {"meta": {**run_meta(), "rounds": args.rounds, "load_before_after": load},
                                       "rows": rows, "raw": {str(k): v for k, v in raw["samples"].items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
