"""K async all_reduces issued back to back, then waited in order (DDP's bucket pattern), world size 2; p50 µs per batch."""
import os, sys, time, statistics, json
import torch, torch.distributed as dist
import tunedist  # noqa: F401
dist.init_process_group("tuned")
K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
ts = [torch.zeros(n) for _ in range(K)]
res = {}
for rnd in range(5):
    samples = []
    for it in range(1500):
        t0 = time.perf_counter()
        ws = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in ws:
            w.wait()
        samples.append((time.perf_counter() - t0) * 1e6)
    res.setdefault("p50", []).append(statistics.median(samples[100:]))
if dist.get_rank() == 0:
    print(json.dumps({"K": K, "n": n, "p50_rounds": [round(x, 1) for x in res["p50"]], "median": round(statistics.median(res["p50"]), 1)}))
dist.destroy_process_group()
