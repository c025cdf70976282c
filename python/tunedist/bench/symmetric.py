"""The zero-copy accounting of `python -m tunedist.bench`'s tuned+sym contender: how many of a point's calls ran
zero-copy (tunedist.symmetric_heap_stats' zero_copy_ops), the run's totals, and the warning when the zero-copy path
did not run where it should have. Conventions: tunedist.bench's docstring."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

_HEAP = ("reserved_bytes", "peak_in_use_bytes", "chunks")


def _over_ranks(values, op) -> list:
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=op)  # on the default (control) group
    return t.tolist()


def zero_copy_row(contender, heap0: dict, calls: int, nbytes: int) -> dict:
    """A symmetric contender's zero-copy calls at a point: the counters' growth since heap0, the least over ranks,
    beside the calls the point made and whether its size S must run zero-copy (only where TUNEDIST_SYMMETRIC_MIN_BYTES
    forces it: by default the group measures each class and may keep the copying path)."""
    now = contender.heap_stats()
    zero_copy, restarts = _over_ranks([now["zero_copy_ops"] - heap0["zero_copy_ops"],
                                       now["copy_restarts"] - heap0["copy_restarts"]], dist.ReduceOp.MIN)
    expected = (dist.get_world_size() > 1 and contender.comm.one_host() and contender.info["forced"]
                and nbytes >= contender.info["min_bytes"])
    path = "zero-copy" if zero_copy == calls else "copying" if zero_copy == 0 else f"mixed {zero_copy}/{calls}"
    return {"path": path, "zero_copy_ops": zero_copy, "calls": calls, "copy_restarts": restarts,
            "zero_copy_expected": expected}


def symmetric_section(contender, heap0: dict, results) -> dict:
    """A symmetric contender's run: its zero-copy calls over all points (least over ranks), its heap at the end (the
    most over ranks), and the points expected to run zero-copy that did not on every call."""
    now = contender.heap_stats()
    zero_copy, restarts = _over_ranks([now[k] - heap0[k] for k in ("zero_copy_ops", "copy_restarts")],
                                      dist.ReduceOp.MIN)
    heap = dict(zip(_HEAP, _over_ranks([now[k] for k in _HEAP], dist.ReduceOp.MAX)))
    rows = [r for r in results if r["backend"] == contender.name]
    return {"min_bytes": contender.info["min_bytes"], "forced": contender.info["forced"],
            "paths": [{k: p[k] for k in ("op", "bytes_from", "path", "windows", "ns_per_byte")}
                      for p in now.get("paths", [])],
            "zero_copy_ops": zero_copy, "copy_restarts": restarts,
            "calls": sum(r["calls"] for r in rows), **heap,
            "points": len(rows), "points_expected": sum(r["zero_copy_expected"] for r in rows),
            "missed": [{k: r[k] for k in ("op", "bytes", "inplace", "zero_copy_ops", "calls")} for r in rows
                       if r["zero_copy_expected"] and r["zero_copy_ops"] < r["calls"]]}


def _size(nbytes: int) -> str:
    units = ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
    return next(f"{nbytes / (1 << shift):.1f} {unit}" for shift, unit in units if nbytes >= 1 << shift or shift == 0)


def zero_copy_lines(sections: dict) -> list:
    """What the tables end with for each symmetric contender: its totals, and a WARNING for every shortfall."""
    lines = []
    for name, s in sections.items():
        how = "forced from" if s["forced"] else "measured per class from"
        lines.append(f"# {name}: zero_copy_ops {s['zero_copy_ops']} of {s['calls']} calls over the run (zero-copy "
                     f"{how} {s['min_bytes']} B; points that must run it: {s['points_expected']} of "
                     f"{s['points']}); copy_restarts "
                     f"{s['copy_restarts']}; heap reserved {_size(s['reserved_bytes'])}, peak in use "
                     f"{_size(s['peak_in_use_bytes'])} (most over ranks)")
        for p in s["paths"]:
            lines.append(f"# {name}: {p['op']} from {_size(p['bytes_from'])}: {p['path']} (windows {p['windows']}; "
                         f"ns/B on rank 0: " + ", ".join(f"{k} {v:.3f}" for k, v in p["ns_per_byte"].items()) + ")")
        if s["zero_copy_ops"] == 0 and s["forced"]:
            lines.append(f"# WARNING: {name}: zero_copy_ops did not grow over the run: every one of its {s['calls']} "
                         f"calls took the copying path, so its rows measure the copying path, not zero-copy "
                         f"(zero-copy needs S >= TUNEDIST_SYMMETRIC_MIN_BYTES = {s['min_bytes']} B, one host and "
                         f"2+ ranks)")
        for m in s["missed"]:
            lines.append(f"# WARNING: {name}: {m['op']}{' in-place' if m['inplace'] else ''} S = {m['bytes']} B "
                         f"ran zero-copy in {m['zero_copy_ops']} of {m['calls']} calls, though S >= "
                         f"{s['min_bytes']} B: that row is not (only) the zero-copy path")
    return lines


def warn_zero_copy(sections: dict) -> None:
    """Prints zero_copy_lines(); the warnings go to stderr too, where a progress bar or a log would show them."""
    for line in zero_copy_lines(sections):
        print(line)
        if "WARNING" in line:
            print(line, file=sys.stderr)
