"""The figure of `python -m tunedist.bench --plot out.png`: busbw and time per op against the size S, log-log, one
line per backend and op (colour: backend; line style and marker: op), with the physical bound drawn in (black).

Bound: only all_reduce has one here, the copy-in/copy-out two-shot ceiling 4(P-1)/(5P+1) x memcpy_gbps
(report.bound_section; docs/performance.md#large-all-reduces-the-bound-and-the-stand-in). It is drawn as a
horizontal busbw line and, on the time panel, as the least time it allows, t(S) = S x 2(P-1)/P / bound. The other
ops have no bound defined, and none is drawn for them.
"""

from __future__ import annotations

BACKEND_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
OP_STYLES = {"all_reduce": ("-", "o"), "all_gather": ("--", "s"), "reduce_scatter": ("-.", "^"),
             "broadcast": ((0, (5, 1, 1, 1)), "v")}
BOUND_STYLE = {"color": "black", "linestyle": ":", "linewidth": 1.5}


def series(results, primary_inplace: dict) -> dict:
    """{(backend, op): rows sorted by size}, the variant each op is summarised by (collectives.PRIMARY_INPLACE)."""
    out: dict = {}
    for r in results:
        if r["inplace"] == primary_inplace[r["op"]] and r["time_us"] is not None:  # None: not timed (wrong results)
            out.setdefault((r["backend"], r["op"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["bytes"]) for k, v in out.items()}


def _draw_lines(ax_bw, ax_t, lines: dict) -> None:
    backends = list(dict.fromkeys(b for b, _ in lines))
    for (backend, op), rows in lines.items():
        linestyle, marker = OP_STYLES.get(op, ("-", "."))
        style = {"color": BACKEND_COLORS[backends.index(backend) % len(BACKEND_COLORS)], "linestyle": linestyle,
                 "marker": marker, "markersize": 3, "label": f"{backend} {op}"}
        bw = [(r["bytes"], r["busbw_gbps"]) for r in rows if r["busbw_gbps"] > 0]  # log axis: no zeros
        if bw:
            ax_bw.plot(*zip(*bw), **style)
        ax_t.plot([r["bytes"] for r in rows], [r["time_us"] for r in rows], **style)


def _draw_all_reduce_bound(ax_bw, ax_t, lines: dict, meta: dict) -> None:
    bound = meta["bound"]["busbw_gbps"]
    sizes = sorted({r["bytes"] for (_, op), rows in lines.items() if op == "all_reduce" for r in rows})
    if not bound or not sizes:
        return
    world = meta["world_size"]
    memcpy = meta["bound"].get("memcpy_gbps", meta["memcpy_gbps"])
    label = f"all_reduce bound {bound:.2f} GB/s = 4(P-1)/(5P+1) x memcpy {memcpy:.1f}"
    ax_bw.axhline(bound, label=label, **BOUND_STYLE)
    factor = 2 * (world - 1) / world
    if factor > 0:
        ax_t.plot(sizes, [s * factor / (bound * 1e9) * 1e6 for s in sizes], label="all_reduce time at the bound",
                  **BOUND_STYLE)


def plot(results, meta: dict, path: str, primary_inplace: dict):
    """Draws the figure into `path` and returns it: a matplotlib Figure of its own, made without pyplot, so that
    no global figure or backend state is touched (savefig renders it with Agg for a PNG)."""
    from matplotlib.figure import Figure  # noqa: PLC0415  (optional dependency, only for --plot)

    fig = Figure(figsize=(14, 5.5))
    ax_bw, ax_t = fig.subplots(1, 2)
    lines = series(results, primary_inplace)
    _draw_lines(ax_bw, ax_t, lines)
    _draw_all_reduce_bound(ax_bw, ax_t, lines, meta)
    measured_us = [r["time_us"] for rows in lines.values() for r in rows]
    if measured_us:  # the bound's time line goes far below the latency floor at small S: keep the data in view
        ax_t.set_ylim(bottom=min(measured_us) / 3, top=max(measured_us) * 2)
    for ax, ylabel in ((ax_bw, "busbw (GB/s)"), (ax_t, "time per op (us)")):
        ax.set(xscale="log", yscale="log", xlabel="size S (bytes)", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax_bw.set_title("bus bandwidth (bound: all_reduce only)")
    ax_t.set_title("time per op (mean of the loop)")
    fig.suptitle(f"tunedist.bench: {meta['world_size']} ranks, {meta.get('simd', '?')} kernels, torch "
                 f"{meta.get('torch', '?')}, memcpy {meta['memcpy_gbps']:.1f} GB/s per rank")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig
