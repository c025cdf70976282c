"""python -m tunedist.doctor: the static checks as a table (check, verdict, evidence, fix); exit 1 on any fail."""

from __future__ import annotations

import argparse
import sys

from ..nccl_env import nccl_summary
from . import diagnose
from .static import Machine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tunedist.doctor", description=__doc__)
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="ranks this host will run (default: LOCAL_WORLD_SIZE, else 1); sizes the /dev/shm and "
                        "threads checks")
    p.add_argument("--tuned-groups", type=int, default=1, help="tuned process groups the job creates (default 1)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON instead of the table")
    args = p.parse_args(argv)
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        p.error("--nproc-per-node must be >= 1")
    if args.tuned_groups < 1:
        p.error("--tuned-groups must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = diagnose(machine=Machine(ranks_on_host=args.nproc_per_node, tuned_groups=args.tuned_groups))
    if args.json:
        print(report.to_json())
    else:
        print(nccl_summary())
        print()
        print(report.table())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
