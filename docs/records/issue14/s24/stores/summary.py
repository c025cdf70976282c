"""Summarises bench_settings outputs of run.sh: per job, op and size, the old chooser (percopy) over the new (auto),
and auto over the faster forced mode (both medians over rounds of per-round ratios, as printed), and which mode won.
    python3 summary.py after after2"""
import re
import sys

LINE = re.compile(r"^\s*(\w+)\s+(\d+)\s+auto\s+([\d.]+)\s+percopy\s+([\d.]+) \(([\d.]+) \[[^]]*\]\)\s+cached\s+([\d.]+) "
                  r"\(([\d.]+) \[[^]]*\]\)\s+streaming\s+([\d.]+) \(([\d.]+) \[[^]]*\]\)", re.M)
for d in sys.argv[1:]:
    for kind in ("ar", "ag_rs_bc", "more"):
        for j in range(1, 10):
            try:
                text = open(f"{d}/{kind}_{j}.txt").read()
            except FileNotFoundError:
                continue
            for m in LINE.finditer(text):
                op, size = m.group(1), int(m.group(2))
                percopy, cached, streaming = float(m.group(5)), float(m.group(7)), float(m.group(9))
                best = "cached" if cached <= streaming else "streaming"
                print(f"{d:7s} job {j} {op:15s} {size >> 20:3d}M  faster forced: {best:9s}  percopy/auto {percopy:.2f}"
                      f"  auto/faster forced {1 / min(cached, streaming):.2f}")
