"""What `python -m tunedist.bench` prints and summarises: the nccl-tests tables, the ratios to the first contender
over the interleaved rounds, the all_reduce bound, and the progress bar. Conventions: tunedist.bench's docstring."""

from __future__ import annotations

import importlib.util
import statistics
import sys

from .collectives import COLLECTIVES

RANK_REDUCTIONS = {0: "rank 0", 1: "average", 2: "min", 3: "max"}
TYPE_NAMES = {"float32": "float", "float": "float", "float16": "half", "half": "half", "bfloat16": "bfloat16",
              "float64": "double", "double": "double", "int32": "int32", "int64": "int64"}  # nccl-tests' spelling
_TIMES = ("time_us", "p10_us", "p50_us", "p90_us", "p99_us")


class Progress:
    """tqdm on stderr when it is installed, else a plain bar; silent off rank 0."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.bar, self.enabled = total, 0, None, enabled
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm  # noqa: PLC0415
            self.bar = tqdm(total=total, file=sys.stderr, unit="pt", dynamic_ncols=True, leave=False)

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif self.enabled and (sys.stderr.isatty() or self.done == self.total or self.done % 20 == 0):
            filled = 30 * self.done // max(1, self.total)
            end = "\r" if sys.stderr.isatty() and self.done < self.total else "\n"
            print(f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label:<40}", end=end,
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def ratios(results, primary_inplace: dict, ref: str) -> list:
    """Each contender's time over ref's (the first contender's) at every point of the summary variant, round by round
    (the rounds interleave, so round k of both ran back to back): the per-round ratios, their median, min and max."""
    timed = [r for r in results if r["time_us"] is not None and r["inplace"] == primary_inplace[r["op"]]]
    base = {(r["op"], r["bytes"]): r for r in timed if r["backend"] == ref}
    out = []
    for r in timed:
        b = base.get((r["op"], r["bytes"]))
        if r["backend"] == ref or b is None:
            continue
        per_round = [t / t0 for t, t0 in zip(r["round_time_us"], b["round_time_us"])]
        out.append({"op": r["op"], "bytes": r["bytes"], "backend": r["backend"], "vs": ref, "ratios": per_round,
                    "ratio_median": statistics.median(per_round), "ratio_min": min(per_round),
                    "ratio_max": max(per_round)})
    return out


BOUNDS = {"copy_in_out": ("4(P-1)/(5P+1)", lambda p: 4 * (p - 1) / (5 * p + 1)),
          "peers_only": ("4(P-1)/(3P+1)", lambda p: 4 * (p - 1) / (3 * p + 1))}


def bound_section(results, world: int, memcpy_gbps: float) -> dict:
    factor = BOUNDS["copy_in_out"][1](world)
    section = {"formula": "4(P-1)/(5P+1) x memcpy_gbps (two-shot all_reduce with copy-in/out)", "factor": factor,
               "memcpy_gbps": memcpy_gbps, "busbw_gbps": factor * memcpy_gbps, "largest": {}, "beside_rounds": {}}
    for r in results:
        if r["op"] == "all_reduce" and r["inplace"] and r.get("busbw_gbps") is not None:
            best = section["largest"].get(r["backend"])
            if best is None or r["bytes"] >= best["bytes"]:
                ratio = r["busbw_gbps"] / section["busbw_gbps"] if section["busbw_gbps"] else None
                section["largest"][r["backend"]] = {"bytes": r["bytes"], "busbw_gbps": r["busbw_gbps"],
                                                    "ratio": ratio}
        if world > 1 and r.get("memcpy_gbps_rounds") and r.get("round_time_us"):
            section["beside_rounds"][r["backend"]] = _beside_rounds(r, world)
    return section


def _beside_rounds(r, world: int) -> dict:
    """busbw of each round over each bound x the memcpy probe that ran just before that round's loops."""
    busbw = [r["bytes"] / (t * 1e3) * COLLECTIVES["all_reduce"].busbw_factor(world) for t in r["round_time_us"]]
    out = {"bytes": r["bytes"], "memcpy_gbps_rounds": r["memcpy_gbps_rounds"], "busbw_gbps_rounds": busbw}
    for name, (formula, factor) in BOUNDS.items():
        per = [b / (factor(world) * m) for b, m in zip(busbw, r["memcpy_gbps_rounds"])]
        out[name] = _spread(formula, per)
    if r.get("standin_us_rounds"):
        # The stand-in's time over the round's: busbw over the stand-in's busbw (> 1: faster than the design runs).
        per = [s["best"] / t for s, t in zip(r["standin_us_rounds"], r["round_time_us"])]
        out["standin"] = {**_spread(STANDIN, per), "standin_us_rounds": r["standin_us_rounds"]}
    return out


STANDIN = "the stand-in (tunedist.bench.standin)"


def _spread(formula: str, per: list) -> dict:
    return {"formula": formula, "ratio_rounds": per, "ratio_median": statistics.median(per), "ratio_min": min(per),
            "ratio_max": max(per)}


def _half(r) -> str:
    if r is None:
        return " ".join([f"{'-':>10}"] * 5 + [f"{'-':>7}"] * 2 + [f"{'-':>6}"])
    if r["time_us"] is None:  # a check found wrong elements and the contender's results are not timed
        return f"{'not timed (wrong results)':>69} {r['wrong']:>6}"
    return (" ".join(f"{r[k]:>10.2f}" for k in _TIMES) + f" {r['algbw_gbps']:>7.2f} {r['busbw_gbps']:>7.2f} "
            f"{r['wrong']:>6}")


def _header(meta, args) -> str:
    return (f"# tunedist.bench: world_size {meta['world_size']}, dtype {args.dtype}, threads "
            f"{meta['threads']['torch_num_threads']}, simd {meta['simd']}, torch {meta['torch']}, time = median "
            f"over {args.rounds} interleaved rounds of the loop's mean, {RANK_REDUCTIONS[args.average]} over ranks, "
            f"memcpy {_memcpy(meta)} GB/s per rank, load {_load(meta)}")


def _memcpy(meta) -> str:
    return " -> ".join(f"{meta[k]:.2f}" for k in ("memcpy_gbps", "memcpy_gbps_end") if k in meta)


def _load(meta) -> str:
    return " -> ".join("/".join(f"{x:.2f}" for x in meta[k]) for k in ("load_avg_start", "load_avg_end") if k in meta)


def print_tables(results, args, meta) -> None:
    print(_header(meta, args))
    for note in meta.get("notes", []):
        print(f"# note: {note}")
    half = " ".join(f"{k:>10}" for k in ("time", "p10", "p50", "p90", "p99")) + f" {'algbw':>7} {'busbw':>7} " \
           f"{'#wrong':>6}"
    units = " ".join([f"{'(us)':>10}"] * 5) + f" {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
    for backend in args.backends:
        for op in args.ops:
            _print_table(results, meta, backend, op, half, units)
    if len(args.backends) > 1:
        print_summary(results, args, meta)
    print_beside_rounds(meta)


def print_beside_rounds(meta) -> None:
    """The all_reduce bound at its point, each round against the memcpy probe and the stand-in that ran just before
    it."""
    for backend, b in meta["bound"].get("beside_rounds", {}).items():
        probes = "/".join(f"{m:.2f}" for m in b["memcpy_gbps_rounds"])
        print(f"# bound beside each round at {b['bytes']} B, {backend}: busbw / (factor x the memcpy probed before "
              f"that round, {probes} GB/s): " + ", ".join(
                  f"{v['formula']} {v['ratio_median']:.3f} [{v['ratio_min']:.3f}-{v['ratio_max']:.3f}]"
                  for v in (b["copy_in_out"], b["peers_only"])))
        if "standin" in b:
            v = b["standin"]
            us = "/".join(f"{s['best']:.0f}" for s in v["standin_us_rounds"])
            print(f"# stand-in beside each round at {b['bytes']} B, {backend}: the peers-only design run on shared "
                  f"memory ({us} us) / the round's time: {v['ratio_median']:.3f} [{v['ratio_min']:.3f}-"
                  f"{v['ratio_max']:.3f}] (> 1: faster than the design runs on these CPUs)")


def _print_table(results, meta, backend, op, half, units) -> None:
    skip = [s for s in meta.get("skipped", []) if (s["backend"], s["op"]) == (backend, op)]
    if skip:
        print(f"#\n# backend {backend}: {op} skipped: {skip[0]['reason']}")
        return
    rows, paths = {}, set()
    for r in results:
        if r["backend"] == backend and r["op"] == op:
            rows.setdefault((r["bytes"], r["count"]), {})[r["inplace"]] = r
            paths.add(r["path"])
    via = f" (path {', '.join(sorted(paths))})" if paths - {"c10d"} else ""
    width = len(half)
    # A symmetric contender (tuned+sym) adds its zero-copy calls per variant: zero_copy_ops / calls at the point.
    zc = any("zero_copy_ops" in r for pair in rows.values() for r in pair.values())
    zc_head, zc_units = (f"     {'zero-copy/calls':>31}", f"     {'(out-of-place, in-place)':>31}") if zc else ("", "")
    print(f"#\n# backend {backend}: {op}{via}\n#{'':>45}{'out-of-place':^{width}}     {'in-place':^{width}}")
    print(f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6}     {half}     {half}{zc_head}")
    print(f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6}     {units}     {units}{zc_units}")
    for (nbytes, count), pair in rows.items():
        any_r = next(iter(pair.values()))
        tail = f"     {_zero_copy(pair.get(False)):>15} {_zero_copy(pair.get(True)):>15}" if zc else ""
        print(f"{nbytes:>12} {count:>12} {TYPE_NAMES[any_r['dtype']]:>8} {any_r['redop']:>6}     "
              f"{_half(pair.get(False))}     {_half(pair.get(True))}{tail}")


def _zero_copy(r) -> str:
    return "-" if r is None or "zero_copy_ops" not in r else f"{r['zero_copy_ops']}/{r['calls']}"


def print_summary(results, args, meta) -> None:
    ref = args.backends[0]
    prim = {(r["backend"], r["op"], r["bytes"]): r for r in results if r["inplace"] == meta["primary_inplace"][r["op"]]}
    by_point = {(s["backend"], s["op"], s["bytes"]): s for s in meta["summary"]}
    bound = meta["bound"]["busbw_gbps"]
    ops = list(dict.fromkeys(r["op"] for r in results))
    variants = "; ".join(f"{', '.join(o for o in ops if meta['primary_inplace'][o] == ip)} {where}"
                         for ip, where in ((True, "in place"), (False, "out of place"))
                         if any(meta["primary_inplace"][o] == ip for o in ops))
    for other in args.backends[1:]:
        print(f"#\n# summary: {ref} vs {other} ({variants}); ratio = {other} time / {ref} time, median over "
              f"{args.rounds} rounds [min-max]; all_reduce bound {bound:.2f} GB/s; cpu = CPU time per op of all ranks' "
              f"processes together")
        w = max(12, len(ref) + 7, len(other) + 7)
        print(f"#{'size(B)':>11} {'op':>15} {ref + ' us':>{w}} {other + ' us':>{w}} {'ratio':>7} {'[min-max]':>13} "
              f"{ref + ' busbw':>{w}} {other + ' busbw':>{w}} {ref + '/bound':>{w}} {ref + ' cpu us':>{w}} "
              f"{other + ' cpu us':>{w}}")
        for (backend, op, nbytes), r in prim.items():
            o, s = prim.get((other, op, nbytes)), by_point.get((other, op, nbytes))
            if backend != ref or s is None:  # s: both timed at this point
                continue
            vs_bound = f"{r['busbw_gbps'] / bound:>{w}.3f}" if op == "all_reduce" and bound else f"{'-':>{w}}"
            spread = f"[{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]"
            print(f"{nbytes:>12} {op:>15} {r['time_us']:>{w}.2f} {o['time_us']:>{w}.2f} {s['ratio_median']:>7.2f} "
                  f"{spread:>13} {r['busbw_gbps']:>{w}.2f} {o['busbw_gbps']:>{w}.2f} {vs_bound} "
                  f"{r['cpu_all_ranks_us']:>{w}.1f} {o['cpu_all_ranks_us']:>{w}.1f}")
