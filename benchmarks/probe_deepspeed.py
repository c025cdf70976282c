"""What DeepSpeed's CPU inference_all_reduce does with the cases the benchmark must not time blindly, measured.

    torchrun --standalone --nproc_per_node=2 benchmarks/probe_deepspeed.py [--json out.json]
    ... --nproc_per_node=4 ...   # adds two 2-rank groups, neither the world

Each case fills rank r's tensor with x(r, i) = (i mod 7) + 1 + 8r (exact in every dtype), calls the API,
`deepspeed.comm.inference_all_reduce(t, op, group)`, and compares rank 0's result (all ranks' verdicts are gathered)
with the right answer. The verdict names what came back: "correct", "unchanged" (the input, not reduced), "sum"
(the sum over the world where another op or group was asked), or "wrong". `path` says what ran, counted by wrapping
both (tunedist.bench.contenders.count_calls): "shm" (DeepSpeed's kernel), "fallback:<backend>" (the API called
torch.distributed.all_reduce instead) or "none" (neither). The "kernel" cases call the op the API dispatches to,
torch.ops.deepspeed.inference_all_reduce_, directly: what the kernel does on a host where the API hands it every
dtype. Kernel calls that need an ISA this CPU lacks are skipped, named.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch
import torch.distributed as dist
from _common import process_group, run_meta, write_json

from tunedist.bench import contenders as bc

N = 4099  # not a multiple of the kernel's vector: the scalar tail runs too


def _input(rank: int, dtype, n: int = N) -> torch.Tensor:
    return ((torch.arange(n) % 7) + 1 + 8 * rank).to(dtype)


def _sum(ranks, dtype) -> torch.Tensor:
    return sum(_input(r, torch.float64) for r in ranks).to(dtype)


def _verdict(got, expected, own, world_sum) -> str:
    if torch.equal(got, expected):
        return "correct"
    if torch.equal(got, own):
        return "unchanged"
    if torch.equal(got, world_sum):
        return "sum"
    return "wrong"


def _case(name, call, t, expected, world) -> dict:
    """Runs call() on t with torch.distributed.all_reduce counted; returns this case's verdicts on every rank."""
    rank = dist.get_rank()
    own, world_sum = t.clone(), _sum(range(world), t.dtype)
    with bc.count_calls() as seen:
        call()
    verdict = _verdict(t.contiguous(), expected, own.contiguous(), world_sum)
    verdicts = [None] * world
    dist.all_gather_object(verdicts, (verdict, seen.path()))
    row = {"case": name, "dtype": str(t.dtype).removeprefix("torch."), "verdicts": [v for v, _ in verdicts],
           "paths": [p for _, p in verdicts], "rank0_first": t.reshape(-1)[:3].tolist(),
           "expected_first": expected.reshape(-1)[:3].tolist()}
    if rank == 0:
        print(f"{name:<34} {row['dtype']:>9} {','.join(sorted(set(row['paths']))):>9}  "
              f"{','.join(sorted(set(row['verdicts'])))}  (rank 0: {row['rank0_first']} expected "
              f"{row['expected_first']})", flush=True)
    return row


def api_cases(dscomm, world) -> list:
    rank, rows, every = dist.get_rank(), [], range(world)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32):
        t = _input(rank, dtype)
        rows.append(_case("api sum", lambda t=t: dscomm.inference_all_reduce(t), t, _sum(every, dtype), world))
    for name, op, fold in (("max", dist.ReduceOp.MAX, torch.maximum), ("min", dist.ReduceOp.MIN, torch.minimum)):
        t, expected = _input(rank, torch.float32), _input(0, torch.float32)
        for r in every:
            expected = fold(expected, _input(r, torch.float32))
        rows.append(_case(f"api {name}", lambda t=t, op=op: dscomm.inference_all_reduce(t, op=op), t, expected, world))
    base = torch.zeros(2 * N)
    view = base[::2]
    view.copy_(_input(rank, torch.float32))
    rows.append(_case("api non-contiguous (stride 2)", lambda: dscomm.inference_all_reduce(view), view,
                      _sum(every, torch.float32), world))
    rows += group_cases(dscomm, world)
    return rows


def group_cases(dscomm, world) -> list:
    """A 1-rank group per rank, and (world >= 4) two halves: groups that are not the world."""
    rank, rows = dist.get_rank(), []
    singles = [dist.new_group([r]) for r in range(world)]
    t = _input(rank, torch.float32)
    rows.append(_case("api group of 1 rank", lambda: dscomm.inference_all_reduce(t, group=singles[rank]), t,
                      _input(rank, torch.float32), world))
    if world >= 4 and world % 2 == 0:
        halves = [list(range(world // 2)), list(range(world // 2, world))]
        groups = [dist.new_group(h) for h in halves]
        mine = 0 if rank < world // 2 else 1
        t = _input(rank, torch.float32)
        rows.append(_case(f"api group {halves[mine]} of {world}", lambda: dscomm.inference_all_reduce(
            t, group=groups[mine]), t, _sum(halves[mine], torch.float32), world))
    return rows


def _kernel(t):
    return torch.ops.deepspeed.inference_all_reduce_(t)  # looked up at each call, so count_calls() sees it


def kernel_cases(level: int, world) -> list:
    """torch.ops.deepspeed.inference_all_reduce_ itself, for the dtypes the API keeps from it on this host."""
    rank, rows = dist.get_rank(), []
    for dtype in (torch.float64, torch.int32, torch.bfloat16, torch.float16):
        if dtype in (torch.bfloat16, torch.float16) and level < 2:
            if rank == 0:
                print(f"{'kernel sum':<34} {str(dtype).removeprefix('torch.'):>9}  skipped: the kernel's reduce for it "
                      f"is compiled for avx512bw, which this CPU lacks (level {level}); the API keeps it from it")
            rows.append({"case": "kernel sum", "dtype": str(dtype).removeprefix("torch."),
                         "skipped": f"needs avx512bw; vector_kernel_level {level}"})
            continue
        t = _input(rank, dtype)
        rows.append(_case("kernel sum", lambda t=t: _kernel(t), t, _sum(range(world), dtype), world))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the cases here (rank 0)")
    args = p.parse_args()
    bc.deepspeed_environment()
    with process_group("gloo", threads=None) as (rank, world):
        dscomm, info = bc.deepspeed_init()
        if rank == 0:
            print(f"# DeepSpeed {info['version']}, torch {torch.__version__}, world {world}, shm kernel level "
                  f"{info['kernel_level']} (2 avx512bw, 1 avx2), default group {dist.get_backend()}, "
                  f"{platform.processor() or platform.machine()}")
            print(f"{'case':<34} {'dtype':>9} {'path':>9}  verdict")
        rows = api_cases(dscomm, world) + kernel_cases(info["kernel_level"], world)
        if rank == 0 and args.json:
            write_json(args.json, {**run_meta(), **info, "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
