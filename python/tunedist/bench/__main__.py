"""The command line of `python -m tunedist.bench`: its arguments, the run's metadata, and the run itself (control
group, contenders, the sweep, the tables, the JSON and the plot). Conventions: tunedist.bench's docstring."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys

import torch
import torch.distributed as dist

import tunedist

from . import __doc__ as CONVENTIONS
from .collectives import ALL_OPS, DTYPES, OPS, PRIMARY_INPLACE, REDOPS, VARIANTS
from .contenders import (
    DEEPSPEED,
    DEEPSPEED_OP,
    OTHER_CONTENDERS,
    TUNED_OP,
    TUNED_SYM,
    deepspeed_problem,
    symmetric_problem,
)
from .contenders import make as make_contender
from .plot import plot
from .report import RANK_REDUCTIONS, Progress, bound_section, print_tables, ratios
from .sweep import DEFAULT_WARMUP, device_of, measure, measure_memcpy, over_ranks, plan
from .symmetric import symmetric_section, warn_zero_copy


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes such as 8, 4K, 64KiB, 256M, 1G")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def _csv(allowed, what):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if allowed is not None and s not in allowed]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(allowed)}")
        return items
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tunedist.bench", description=CONVENTIONS.split("\n")[0],
                                epilog="Run it under torchrun; rank 0 prints. Conventions: see the module docstring.")
    p.add_argument("--backends", type=_csv(None, "backend"), default=["tuned", "gloo"],
                   help="comma-separated CPU c10d backends, deepspeed, deepspeed-op, tuned-op and/or tuned+sym (a "
                        "tuned group on buffers from its symmetric heap: zero-copy or copying per op and size class as "
                        "the group measures them, from 64K; TUNEDIST_SYMMETRIC_MIN_BYTES forces zero-copy from that "
                        "size), all measured in this run, interleaved; the "
                        "summary compares each with the first (default tuned,gloo)")
    p.add_argument("--ops", type=_csv(ALL_OPS, "op"), default=list(OPS),
                   help="comma-separated, default the four above; also all_to_all, reduce, gather, scatter")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--step-factor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, help="timed calls per point and round (default: adaptive, --target-s)")
    p.add_argument("-w", "--warmup", type=int, help=f"warm-up calls per point (default: up to {DEFAULT_WARMUP})")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point: A B C A B C ... (default 3)")
    p.add_argument("--target-s", type=float, default=0.25, help="seconds an adaptive timed loop aims at")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("-d", "--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("-o", "--op", dest="redop", choices=sorted(REDOPS), default="sum")
    p.add_argument("-a", "--average", type=int, choices=sorted(RANK_REDUCTIONS), default=1,
                   help="reduce times over ranks: 0 rank 0, 1 average (default), 2 min, 3 max")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="count wrong elements (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the buffers live (cuda: cuda:LOCAL_RANK; each call then waits for its kernels)")
    p.add_argument("--memcpy-bytes", type=parse_size, default=256 << 20,
                   help="buffer of the memcpy probe; at least --max-bytes is used (default 256M)")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--plot", help="draw busbw and time against size into this image (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)
    for b in args.backends:
        problem = _backend_problem(b, args.device)
        if problem:
            p.error(problem)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False here")
    if not 1 <= args.min_bytes <= args.max_bytes or args.step_factor < 2:
        p.error("need 1 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib, which is not installed (pip install matplotlib), or drop --plot")
    return args


def _backend_problem(name: str, device: str) -> str | None:
    if name in (DEEPSPEED, DEEPSPEED_OP):
        return deepspeed_problem(device)
    if name == TUNED_SYM:
        return symmetric_problem(device)
    caps = dist.Backend.backend_capability.get("tuned" if name == TUNED_OP else name.lower())
    if caps is None:
        return (f"unknown backend {name!r}: registered are {', '.join(sorted(dist.Backend.backend_capability))}, "
                f"and {', '.join(OTHER_CONTENDERS)}")
    if device not in caps:
        return f"backend {name!r} does not serve {device} tensors (devices {caps}); see --device"
    return None


def _meta(args, world, contenders) -> dict:
    skipped = [{"backend": c.name, "op": op, "reason": f"{c.name} has {', '.join(c.ops)} only"}
               for c in contenders for op in args.ops if not c.has(op)]
    return {"world_size": world, "device": args.device, "memcpy_gbps": measure_memcpy(args),
            "simd": tunedist.simd_level(), "torch": torch.__version__, "tunedist": tunedist.version(),
            "average": RANK_REDUCTIONS[args.average], "rounds": args.rounds, "backends": args.backends,
            "threads": {"torch_num_threads": torch.get_num_threads(), "requested": args.threads,
                        "torch_num_interop_threads": torch.get_num_interop_threads(),
                        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
            "contenders": {c.name: c.info for c in contenders if c.info}, "skipped": skipped,
            "notes": [n for c in contenders for n in c.notes], "primary_inplace": PRIMARY_INPLACE}


def _load_avg() -> list:
    return over_ranks(list(os.getloadavg()), 0)  # rank 0's: the ranks share the machine


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")  # control traffic only; every measured contender gets a group of its own
    rank, world = dist.get_rank(), dist.get_world_size()
    contenders = [make_contender(b) for b in args.backends]
    if args.device == "cuda":
        torch.cuda.set_device(device_of(args))
    meta = {**_meta(args, world, contenders), "load_avg_start": _load_avg()}
    heap0 = {c.name: c.heap_stats() for c in contenders if c.symmetric}
    total = sum(len(VARIANTS[op]) * sum(c.has(op) for c in contenders) for op, _ in plan(args, world)) * args.rounds
    progress = Progress(total, rank == 0 and not args.no_progress)
    results = measure(args, contenders, progress, meta.setdefault("notes", []))
    progress.close()
    meta["load_avg_end"] = _load_avg()
    meta["memcpy_gbps_end"] = measure_memcpy(args)
    if "tuned" in args.backends:  # hosts the tuned group spans (hierarchical collectives over gloo when more than one)
        group = contenders[args.backends.index("tuned")].comm.group
        meta["tuned_hosts"] = tunedist._C.host_layout(group._get_backend(torch.device("cpu")))
    meta["bound"] = bound_section(results, world, (meta["memcpy_gbps"] + meta["memcpy_gbps_end"]) / 2)
    meta["summary"] = ratios(results, PRIMARY_INPLACE, args.backends[0])
    meta["symmetric"] = {c.name: symmetric_section(c, heap0[c.name], results) for c in contenders if c.symmetric}
    if rank == 0:
        if len(meta.get("tuned_hosts", [])) > 1:
            print(f"# tuned spans {len(meta['tuned_hosts'])} hosts: {meta['tuned_hosts']} (TUNEDIST_HOST_ID)")
        print_tables(results, args, meta)
        warn_zero_copy(meta["symmetric"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**meta, "results": results}, f, indent=1)
        if args.plot:
            plot(results, meta, args.plot, PRIMARY_INPLACE)
    dist.barrier()
    for c in contenders:
        c.comm.close()
    dist.destroy_process_group()
    return 1 if any(r["wrong"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
