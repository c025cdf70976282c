"""The per-call cost of each way to name the group of torch.ops.tunedist.all_reduce_: the group's name (the default
overload), its TorchScript object (`.group`, ProcessGroup.boxed()), the plain ProcessGroup through the operator
packet (which tries `.default` and `.group` before the `.pg` overload) and `.pg` called directly, beside
tunedist.all_reduce(t, group=group).

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_op_group_forms.py --json forms.json

Each round times one loop of back-to-back calls per form (the forms take turns); a form's figure is the median over
rounds of a loop's mean µs per call, with the spread (min-max over rounds). Printed from rank 0 with the load average.
"""

from __future__ import annotations

import argparse
import statistics

import _common
import torch
import torch.distributed as dist

import tunedist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=_common.parse_size, default=4096, help="all_reduce size per rank (default 4K)")
    p.add_argument("--iters", type=int, default=1000, help="calls per timed loop (default 1000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds, the forms taking turns in each (default 7)")
    p.add_argument("--json", help="write the results here (rank 0)")
    args = p.parse_args()
    op = torch.ops.tunedist.all_reduce_
    with _common.process_group("tuned") as (rank, _):
        group = dist.group.WORLD
        t = torch.ones(args.bytes // 4)
        name, boxed = group.group_name, group.boxed()
        forms = {
            "name": lambda: op(t, "sum", name),
            "boxed (.group)": lambda: op(t, "sum", boxed),
            "ProcessGroup (packet)": lambda: op(t, "sum", group),
            "ProcessGroup (.pg)": lambda: op.pg(t, "sum", group),
            "tunedist.all_reduce": lambda: tunedist.all_reduce(t, group=group),
        }
        rows: dict[str, list[float]] = {k: [] for k in forms}
        for _ in range(args.rounds):
            for label, call in forms.items():
                dist.barrier()
                for _ in range(5):
                    call()
                rows[label].append(_common.loop_mean_s(call, args.iters) * 1e6)
        result = {"bytes": args.bytes, "iters": args.iters, "rounds": args.rounds, "load": _common.load_avg(),
                  **_common.run_meta(), "us": {k: _common.spread(v) for k, v in rows.items()}}
        if rank == 0:
            for label, v in rows.items():
                print(f"{label:24s} {statistics.median(v):8.2f} us/call (rounds {min(v):.2f}-{max(v):.2f})")
            print(f"load average {' '.join(f'{x:.2f}' for x in result['load'])}")
            if args.json:
                _common.write_json(args.json, result)


if __name__ == "__main__":
    main()
