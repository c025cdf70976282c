"""Reads netns_bench.sh records and sets tuned's and gloo's all_reduce against the bytes each must put on the link.

    python benchmarks/netns_report.py OUT_DIR          # every <rate>_run<k>.json that netns_bench.sh wrote there
    python benchmarks/netns_report.py a.json b.json ...

Notation: 2 hosts (network namespaces) of L ranks, P = 2L ranks, N = bytes of each rank's buffer, R = the line rate
each way: the TCP goodput (payload bytes/s) netns_linerate.py measured with both ways loaded at once, as they are in
an all_reduce.

Flat gloo. ProcessGroupGloo's CPU all_reduce is gloo::allreduce, whose default algorithm is the ring of
gloo/allreduce.cc: rank r sends only to (r - 1) mod P and receives only from (r + 1) mod P. Its reduce-scatter
sends (P - 1)/P x N per rank, and its all-gather the same again, so each ring edge carries 2(P - 1)/P x N, one
way. torchrun numbers the ranks node by node (host A = ranks 0..L-1, host B = L..P-1), so exactly two edges cross
the link: L -> L-1 (B to A) and 0 -> P-1 (A to B), one each way. The link carries 2(P - 1)/P x N each way:
1.5 N at 2 x 2, 1.75 N at 2 x 4, approaching 2 N.

Hierarchical tuned (csrc/backend/engine/hier/allreduce.cpp). A shared-memory reduce-scatter leaves position j of
each host with its host's partial sum of block j (N/L bytes). The two position-j ranks, one per host, all-reduce
block j in a gloo group of two, whose ring sends 2(2 - 1)/2 x N/L = N/L each way. L such pairs make N each way, in
any layout of 2 hosts (the spans of uneven hosts still partition the buffer). The 8 MiB pipeline chunks change no
total. N each way is also the least any all_reduce can send: each host's result depends on all N bytes of the
other host's input.

Bound. With both at line rate, gloo takes 2(P - 1)/P x N / R and tuned N / R, so the speedup gloo/tuned is at most
2(P - 1)/P = 1.5 at 2 x 2 (a speedup of 2 at 2 x 2 is above it). tuned can beat 1.5 only where gloo leaves the
link idle. "vs bound" is speedup / 1.5; "tuned/line" and "gloo/line" are each backend's bytes across per direction
per second (N / time, 1.5 N / time) over R.

The wire check reads netns_wire.py's counts: the bytes the veth transmitted each way per 16 MiB all_reduce, over
N, against the payload model above (tuned 1, gloo 2(P - 1)/P), and what tuned handed gloo per rank (model 1/L).
The veth counts GSO super-packets (one set of headers per up to 64 KiB), so headers add about 0.1%; a stream that
flows one way only (each of gloo's two crossing edges) also makes the other way carry its pure ACKs, about 2% of
its bytes at one ACK per two segments. tuned's pairs send both ways on one connection, where the ACKs ride on data.
tbf, unlike the counter, charges every segment's headers (1514 bytes per 1448 of payload at MTU 1500): that is
why R, a payload rate, is about 0.956 of the configured rate.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys


def load(paths: list[str]) -> list[dict]:
    files = []
    for p in paths:
        if os.path.isdir(p):  # the bench records only, not their .linerate.json and .wire.json
            files += sorted(f for f in glob.glob(os.path.join(p, "*_run*.json")) if re.search(r"_run\d+\.json$", f))
        else:
            files.append(p)
    records = []
    for f in files:
        with open(f) as fh:
            rec = json.load(fh)
        if "netns" not in rec:
            sys.exit(f"{f}: no 'netns' section; not written by netns_bench.sh")
        rec["path"] = f
        records.append(rec)
    if not records:
        sys.exit("no records found")
    return records


def rate_bits(rate: str) -> float:
    """1gbit -> 1e9; "unshaped" sorts last."""
    m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", rate)
    return int(m.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)] if m else float("inf")


def gloo_cross_factor(hosts: list[list[int]]) -> float:
    """Bytes flat gloo's ring sends across, in the busier direction, per byte of N (ranks 0..P-1 in ring order)."""
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
    p = len(host_of)
    per_edge = 2 * (p - 1) / p
    crossing = {}
    for r in range(p):
        a, b = host_of[r], host_of[(r - 1) % p]  # gloo's ring: rank r sends to r - 1
        if a != b:
            crossing[(a, b)] = crossing.get((a, b), 0) + per_edge
    return max(crossing.values())


def line_rate(rec: dict) -> float:
    both = rec["netns"]["line_rate"]["both_at_once"]
    return statistics.mean(x["bytes_per_s"] for x in both)


def times(rec: dict) -> dict:
    """{(backend, bytes): time_us} of the in-place all_reduce."""
    return {
        (r["backend"], r["bytes"]): r["time_us"] for r in rec["results"] if r["op"] == "all_reduce" and r["inplace"]
    }


def check(rec: dict) -> list[str]:
    problems = []
    if len(rec.get("tuned_hosts", [])) != 2:
        problems.append(f"tuned spans {rec.get('tuned_hosts')}, not 2 hosts")
    wrong = sum(r["wrong"] for r in rec["results"])
    if wrong:
        problems.append(f"#wrong = {wrong}")
    return problems


def size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def rate_table(rate: str, recs: list[dict]) -> None:
    hosts = recs[0]["tuned_hosts"]
    gloo_f, tuned_f = gloo_cross_factor(hosts), 1.0
    bound = gloo_f / tuned_f
    lines = [line_rate(r) for r in recs]
    line = statistics.median(lines)
    print(f"\n## {rate}: {recs[0]['netns']['tbf']}; {len(recs)} run(s); hosts {hosts}")
    print(
        f"line rate R (TCP goodput each way, both ways loaded): {line / 1e6:.1f} MB/s "
        f"(runs {', '.join(f'{x / 1e6:.1f}' for x in lines)}); bytes across each way per op: tuned "
        f"{tuned_f:g} N, gloo {gloo_f:g} N; speedup bound {bound:g}"
    )
    for r in recs:
        print(
            f"  {os.path.basename(r['path'])}: uptime {r['netns']['uptime_before'].split('load average: ')[-1]}"
            f" -> {r['netns']['uptime_after'].split('load average: ')[-1]}"
        )
    print(
        "\n| size | tuned ms | gloo ms | speedup (runs) | bound | vs bound | tuned/line | gloo/line | floor ms "
        "tuned / gloo |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    per_run = [times(r) for r in recs]
    for n in sorted({b for t in per_run for (_, b) in t}):
        tu = [t[("tuned", n)] / 1e3 for t in per_run if ("tuned", n) in t]
        gl = [t[("gloo", n)] / 1e3 for t in per_run if ("gloo", n) in t]
        sp = [t[("gloo", n)] / t[("tuned", n)] for t in per_run if ("tuned", n) in t and ("gloo", n) in t]
        if not tu or not gl:
            continue
        t_med, g_med, s_med = statistics.median(tu), statistics.median(gl), statistics.median(sp)
        spread = f" ({min(sp):.2f}–{max(sp):.2f})" if len(sp) > 1 else ""
        tuned_util = tuned_f * n / (t_med / 1e3) / line
        gloo_util = gloo_f * n / (g_med / 1e3) / line
        floors = f"{tuned_f * n / line * 1e3:.1f} / {gloo_f * n / line * 1e3:.1f}"
        print(
            f"| {size_text(n)} | {t_med:.1f} | {g_med:.1f} | {s_med:.2f}×{spread} | {bound:g}× | "
            f"{s_med / bound:.2f} | {tuned_util:.2f} | {gloo_util:.2f} | {floors} |"
        )


def wire_table(rate: str, rec: dict) -> None:
    wire = rec["netns"]["wire"]
    n, iters = wire["bytes"], wire["iters"]
    hosts = wire["ranks"][0].get("tuned_hosts") or rec["tuned_hosts"]
    model = {"tuned": 1.0, "gloo": gloo_cross_factor(hosts)}
    local_size = len(hosts[0])
    print(
        f"\nwire check at {rate} ({size_text(n)} all_reduce x {iters}; veth tx bytes per op over N, each way; "
        f"A = the node of rank 0):"
    )
    for backend in sorted({b for r in wire["ranks"] for b in r["backends"]}):
        ways = [
            r["backends"][backend]["tx_bytes"] / (iters * n)
            for r in sorted(wire["ranks"], key=lambda r: r["node"])
            if r["local_rank"] == 0 and backend in r["backends"]
        ]
        text = " / ".join(f"{w:.3f}" for w in ways)
        line = f"  {backend}: A->B / B->A {text}; payload model {model.get(backend, float('nan')):g}"
        handed = [r["backends"][backend]["handed_to_gloo"] for r in wire["ranks"] if backend in r["backends"]]
        if backend == "tuned" and all(h is not None for h in handed):
            line += (
                f"; handed to gloo per rank / N {statistics.mean(handed) / (iters * n):.3f} "
                f"(model 1/L = {1 / local_size:.3f})"
            )
        print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="record files, or folders holding *_run*.json")
    args = p.parse_args(argv)
    records = load(args.paths)
    bad = 0
    for rec in records:
        for problem in check(rec):
            print(f"{rec['path']}: {problem}")
            bad += 1
    by_rate = {}
    for rec in records:
        by_rate.setdefault(rec["netns"]["rate"], []).append(rec)
    print(
        f"# tunedist {records[0].get('tunedist')}, torch {records[0].get('torch')}, world size "
        f"{records[0]['world_size']}, in-place all_reduce, float32; times are medians over runs"
    )
    for rate, recs in sorted(by_rate.items(), key=lambda kv: rate_bits(kv[0])):
        rate_table(rate, recs)
        if recs[0]["netns"].get("wire"):
            wire_table(rate, recs[0])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
