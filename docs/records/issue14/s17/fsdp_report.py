"""Median FSDP2 step (ms) per policy and configuration, and batch/normal per round: python3 fsdp_report.py DIR"""
import glob, re, statistics, sys
d = sys.argv[1]
vals = {}
for f in glob.glob(f"{d}/*_*.txt"):
    pol, k = re.match(r".*/(normal|batch)_(\d+)\.txt", f).groups()
    for line in open(f):
        m = re.match(r"\s+(plain|symmetric)\s+([\d.]+)", line)
        if m:
            vals[(pol, m.group(1), int(k))] = float(m.group(2))
for cfg in ("plain", "symmetric"):
    ks = sorted({k for p, c, k in vals if c == cfg})
    n = [vals[("normal", cfg, k)] for k in ks]
    b = [vals[("batch", cfg, k)] for k in ks]
    print(f"{cfg:>9}: normal median {statistics.median(n):.2f} ms, batch {statistics.median(b):.2f} ms; "
          f"batch/normal per round " + " ".join(f"{y / x:.2f}" for x, y in zip(n, b)))
