"""The main job's outputs: one table (rows()/table()), one JSON record (save_json()), one figure (plot()).

A row says what runs (baseline against tunedist), the metric, both values, the gain (above 1: tunedist is better,
whatever the metric's direction) and whether the two runs' results matched. Times are medians with [p10-p90].
"""

from __future__ import annotations

import json
import os
import platform

MIB = 2**20


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "vcpus": os.cpu_count(), "platform": platform.platform()}


def _runs(workload: dict) -> dict:
    return {r["name"]: r for r in workload["runs"]}


def _ms(b: dict) -> str:
    return f"{b['median']:.1f} [{b['p10']:.1f}-{b['p90']:.1f}]"


def _row(workload: str, what: str, metric: str, base: float, ours: float, base_s: str, ours_s: str, gain: float,
         matched: bool | None) -> dict:
    return {"workload": workload, "what": what, "metric": metric, "baseline": base, "tunedist": ours,
            "baseline_text": base_s, "tunedist_text": ours_s, "gain": gain, "matched": matched}


def _ddp_rows(w: dict) -> list:
    base, ours = w["runs"]
    what = f"gloo+DDP -> tuned+{ours['choice'].replace(' ', '')}+{ours['hook']} hook"
    matched = w["check"]["matched"]
    bt, ot = base["breakdown_ms"]["total"], ours["breakdown_ms"]["total"]
    return [_row("DDP", what, "samples/s", base["samples_per_s"], ours["samples_per_s"],
                 f"{base['samples_per_s']:.1f}", f"{ours['samples_per_s']:.1f}",
                 ours["samples_per_s"] / base["samples_per_s"], matched),
            _row("DDP", what, "step ms", bt["median"], ot["median"], _ms(bt), _ms(ot),
                 bt["median"] / ot["median"], matched)]


def _fsdp_rows(w: dict) -> list:
    base, ours = w["runs"]
    what = "gloo -> tuned+symmetric buffers"
    matched = w["check"]["matched"]
    bt, ot = base["breakdown_ms"]["total"], ours["breakdown_ms"]["total"]
    bm, om = base["memory_bytes"]["peak"], ours["memory_bytes"]["peak"]
    return [_row("FSDP2", what, "step ms", bt["median"], ot["median"], _ms(bt), _ms(ot),
                 bt["median"] / ot["median"], matched),
            _row("FSDP2", what, "peak MiB/rank", bm / MIB, om / MIB, f"{bm / MIB:.0f}", f"{om / MIB:.0f}",
                 bm / om, matched)]


def _tp_rows(w: dict) -> list:
    runs = _runs(w)
    base = runs["gloo"]
    matched = w["check"]["matched"]
    out = []
    for name in ("tuned dist.all_reduce", "tunedist.all_reduce"):
        ours = runs[name]
        what = f"gloo -> {name}"
        bt, ot = base["breakdown_ms"]["total"], ours["breakdown_ms"]["total"]
        out.append(_row("TP decode", what, "tokens/s", base["tokens_per_s"], ours["tokens_per_s"],
                        f"{base['tokens_per_s']:.0f}", f"{ours['tokens_per_s']:.0f}",
                        ours["tokens_per_s"] / base["tokens_per_s"], matched))
        out.append(_row("TP decode", what, "ms/token p50/p99", bt["median"], ot["median"],
                        f"{bt['median']:.2f}/{bt['p99']:.2f}", f"{ot['median']:.2f}/{ot['p99']:.2f}",
                        bt["median"] / ot["median"], matched))
    if "DeepSpeed" in runs:
        ds, ours = runs["DeepSpeed"], runs["tunedist.all_reduce"]
        out.append(_row("TP decode", "DeepSpeed -> tunedist.all_reduce", "tokens/s",
                        ds["tokens_per_s"], ours["tokens_per_s"], f"{ds['tokens_per_s']:.0f}",
                        f"{ours['tokens_per_s']:.0f}", ours["tokens_per_s"] / ds["tokens_per_s"], matched))
    return out


def rows(record: dict) -> list:
    build = {"ddp": _ddp_rows, "fsdp2": _fsdp_rows, "tp_decode": _tp_rows}
    return [row for name, w in record["workloads"].items() for row in build[name](w)]


def _notes(record: dict) -> list:
    notes = []
    w = record["workloads"]
    if "ddp" in w:
        d = w["ddp"]
        notes.append(f"DDP: {d['model']['params'] / 1e6:.1f} M-parameter transformer, {d['model']['batch_per_rank']} "
                     f"x {d['model']['seq_len']} tokens per rank and step; gloo with DDP's default 25 MB buckets and "
                     f"no hook, against tuned with the tuner's buckets and the hook it advises; "
                     f"{d['steps'] - d['warmup_steps']} timed steps each")
    if "ddp" in w and not w["ddp"]["check"]["exact"]:
        notes.append(f"DDP: the {w['ddp']['runs'][1]['hook']} hook compresses gradients; losses compared to 1%")
    if "fsdp2" in w:
        f = w["fsdp2"]
        mem = {r["role"]: r["memory_bytes"] for r in f["runs"]}
        o = mem["tunedist"]
        notes.append(f"FSDP2: {f['model']['params'] / 1e6:.1f} M-parameter transformer, fully_shard per layer, bf16 "
                     f"parameters and fp32 gradient reduction, AdamW; {f['steps']} timed steps each")
        notes.append(f"FSDP2 peak = state + step peak growth + communication memory held; tunedist holds "
                     f"{o['heap_reserved'] / MIB:.0f} MiB of symmetric heap (peak in use "
                     f"{o['heap_peak_in_use'] / MIB:.0f}) + {o['slots'] / MIB:.0f} MiB of slots; step growth "
                     f"{mem['baseline']['step_peak_growth'] / MIB:.0f} (gloo) vs {o['step_peak_growth'] / MIB:.0f} "
                     f"MiB; {f['zero_copy_ops']} zero-copy collectives")
        if not f["peak_rss_measured"]:
            notes.append("FSDP2: /proc/self/clear_refs is not writable here, so the step growth is not measured")
    if "tp_decode" in w:
        t = w["tp_decode"]
        m = t["model"]
        notes.append(f"TP decode: {m['layers']} layers, d_model {m['d_model']}, one {m['all_reduce_bytes']} B "
                     f"all_reduce per layer per token, batch 1, {t['rounds']} rounds x {t['tokens_per_generation'] - 1}"
                     f" timed tokens per contender")
        ds = t["deepspeed"]
        if ds["used"]:
            notes.append(f"DeepSpeed {ds['version']}: its shm kernel ran {ds['kernel_calls']} times, its fallback "
                         f"(dist.all_reduce) {ds['fallback_calls']} times in a 2-token check")
        else:
            torch_version = record["torch"].split("+")[0]
            notes.append(f"DeepSpeed not measured ({ds['reason']}); to add it, install it with torch held at "
                         f"{torch_version} (echo torch=={torch_version} > c.txt; pip install -c c.txt deepspeed) and "
                         "rerun: the job sets DS_ACCELERATOR=cpu, and DeepSpeed's first run builds its shm op")
    return notes


def table(record: dict) -> str:
    head = ("workload", "baseline -> tunedist", "metric", "baseline", "tunedist", "gain", "matched")
    body = [(r["workload"], r["what"], r["metric"], r["baseline_text"], r["tunedist_text"], f"{r['gain']:.2f}x",
             {True: "yes", False: "NO", None: "-"}[r["matched"]]) for r in record["table"]]
    widths = [max(len(str(c[i])) for c in [head, *body]) for i in range(len(head))]
    lines = ["", "tunedist main job: " + _sitting(record)]
    for cells in [head, *body]:
        lines.append("  ".join(str(c).rjust(w) if i in (3, 4, 5) else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    lines.append("gain: above 1 tunedist is better (throughput ours/baseline; time and memory baseline/ours); "
                 "times are medians [p10-p90] over every sample, each sample the slowest rank's")
    lines += [f"- {n}" for n in _notes(record)]
    return "\n".join(lines)


def _sitting(record: dict) -> str:
    m = record["machine"]
    load = record["load"]
    return (f"{record['world_size']} ranks on a {m['vcpus']}-vCPU {m['cpu']}, {record['threads_per_rank']} thread "
            f"per rank; load (1/5/15 min) {load['start']} at the start, {list(load.values())[-1]} at the end")


def save_json(record: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "optimizer": "#55A868"}
LABELS = {"compute": "compute", "comm": "exposed communication", "optimizer": "optimizer"}


def _breakdown_panel(ax, runs: list, unit: str, title: str) -> None:
    """Stacked medians of compute, exposed communication and optimizer per run, each part's p10-p90 as a whisker at
    its own offset, and above each bar the total's median [p10-p90] and its gain over the first run (the baseline)."""
    base = runs[0]["breakdown_ms"]["total"]["median"]
    top = 0.0
    for i, run in enumerate(runs):
        b = run["breakdown_ms"]
        bottom = bar_top = 0.0
        # The bars add up to the total's median: compute's and the optimizer's medians, and the rest as exposed
        # communication (the median of a sum is not the sum of the medians).
        heights = {"compute": b["compute"]["median"], "optimizer": b["optimizer"]["median"]}
        heights["comm"] = max(0.0, b["total"]["median"] - heights["compute"] - heights["optimizer"])
        for j, part in enumerate(("compute", "comm", "optimizer")):
            med = heights[part]
            ax.bar(i, med, bottom=bottom, color=COLORS[part], width=0.6)
            if b[part]["p90"] > 0.0:
                y = bottom + med
                low, high = b[part]["median"] - b[part]["p10"], b[part]["p90"] - b[part]["median"]
                ax.errorbar(i - 0.2 + 0.2 * j, y, yerr=[[min(low, y)], [high]], fmt="none", ecolor="black",
                            elinewidth=1, capsize=3)
                bar_top = max(bar_top, y + high)
            bottom += med
        t = b["total"]
        label = f"total {t['median']:.1f} [{t['p10']:.1f}-{t['p90']:.1f}]"
        if i:
            label += f"\n{base / t['median']:.2f}x the baseline"
        bar_top = max(bar_top, bottom)
        ax.text(i, bar_top * 1.03, label, ha="center", va="bottom", fontsize=8 if len(runs) < 4 else 7)
        top = max(top, bar_top)
    ax.set_xticks(range(len(runs)), [r["name"].replace(" + ", "\n+ ").replace(" dist.", "\ndist.")
                                     for r in runs], fontsize=8)
    ax.set_ylabel(unit)
    ax.set_ylim(0, top * 1.35)
    ax.set_title(title, fontsize=10)


def _memory_panel(ax, w: dict) -> None:
    parts = (("state", "parameter shards, gradients, AdamW", "#8172B3"),
             ("step_peak_growth", "step peak growth", "#C44E52"),
             ("comm_held", "communication memory held", "#937860"))
    for i, run in enumerate(w["runs"]):
        mem, bottom = run["memory_bytes"], 0.0
        for key, label, color in parts:
            ax.bar(i, mem[key] / MIB, bottom=bottom, color=color, width=0.6, label=label if i == 0 else None)
            bottom += mem[key] / MIB
        ax.text(i, bottom * 1.02, f"{bottom:.0f} MiB", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(w["runs"])), [r["name"].replace(" + ", "\n+ ") for r in w["runs"]], fontsize=8)
    ax.set_ylabel("MiB per rank (most over ranks)")
    ax.set_title("FSDP2: peak memory per rank", fontsize=10)
    ax.margins(y=0.2)
    ax.legend(fontsize=7, loc="upper left")


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    w = record["workloads"]
    panels = [(name, w[name]) for name in ("ddp", "fsdp2", "tp_decode") if name in w]
    n = len(panels) + (1 if "fsdp2" in w else 0)
    cols = 2 if n > 1 else 1
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(6.2 * cols, 4.4 * ((n + cols - 1) // cols)),
                             squeeze=False)
    axes = axes.ravel()
    titles = {"ddp": ("ms per training step", "DDP training"), "fsdp2": ("ms per training step", "FSDP2 training"),
              "tp_decode": ("ms per decoded token", "tensor-parallel decoding, batch 1")}
    k = 0
    for name, wl in panels:
        unit, title = titles[name]
        ok = "results matched" if wl["check"]["matched"] else "RESULTS DIFFER"
        n_samples = wl["runs"][0]["breakdown_ms"]["total"]["n"]
        _breakdown_panel(axes[k], wl["runs"], unit, f"{title} ({n_samples} samples per run; {ok})")
        k += 1
        if name == "fsdp2":
            _memory_panel(axes[k], wl)
            k += 1
    for ax in axes[k:]:
        ax.axis("off")
    handles = [matplotlib.patches.Patch(color=COLORS[p], label=LABELS[p]) for p in COLORS]
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, 0.915), frameon=False)
    fig.suptitle(f"tunedist main job: {_sitting(record)}\nbars: median compute and optimizer, the rest of the median "
                 "total as exposed communication; whiskers: p10-p90 of each part's samples\ncompute = the same work "
                 "without communication, timed next to it on the same rank", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
