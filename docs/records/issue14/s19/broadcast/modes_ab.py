# One job, three tuned groups whose slot stores are cached / streaming / auto (env read at group creation), taking
# turns size by size: loop mean per call (total / iters) of an op, averaged over ranks; median over rounds.
#   torchrun --standalone --nproc_per_node=2 modes_ab.py OP [sizes]
import os, sys, time, statistics, torch, torch.distributed as dist, tunedist
op = sys.argv[1]; sizes = [int(s[:-1]) << (10 if s[-1] == 'K' else 20) for s in (sys.argv[2] if len(sys.argv) > 2 else "16K,32K,64K,128K,256K,512K,1M,4M").split(",")]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
groups = {}
for m in ("cached", "streaming", "auto"):
    os.environ["TUNEDIST_SLOT_STORES"] = m
    groups[m] = dist.new_group(backend="tuned")
R = int(os.environ.get("ROUNDS", "7"))
def calls(nbytes, g):
    n = nbytes // 4
    if op == "broadcast":
        t = torch.full((n,), float(rank)); 
        return lambda: dist.broadcast(t, src=0, group=g)
    if op == "all_reduce":
        t = torch.ones(n); return lambda: dist.all_reduce(t, group=g)
    if op == "all_gather":
        i = torch.ones(n // world); o = torch.empty(n); return lambda: dist.all_gather_into_tensor(o, i, group=g)
    if op == "reduce_scatter":
        i = torch.ones(n); o = torch.empty(n // world); return lambda: dist.reduce_scatter_tensor(o, i, group=g)
print_rows = []
for nb in sizes:
    iters = max(20, min(3000, (128 << 20) // nb // 4))
    fns = {m: calls(nb, g) for m, g in groups.items()}
    for f in fns.values():
        for _ in range(10): f()
    per = {m: [] for m in fns}
    for r in range(R):
        for m, f in fns.items():
            dist.barrier(); f()
            a = time.perf_counter()
            for _ in range(iters): f()
            t = torch.tensor([(time.perf_counter() - a) / iters * 1e6], dtype=torch.float64)
            dist.all_reduce(t); per[m].append(t.item() / world)
    if rank == 0:
        med = {m: statistics.median(v) for m, v in per.items()}
        rs = sorted(s / c for s, c in zip(per["streaming"], per["cached"]))
        ra = sorted(a / c for a, c in zip(per["auto"], per["cached"]))
        print(f"{op} {nb:>9}  cached {med['cached']:8.1f}  streaming {med['streaming']:8.1f}  auto {med['auto']:8.1f} us"
              f"   streaming/cached {statistics.median(rs):.2f} [{rs[0]:.2f}-{rs[-1]:.2f}]  auto/cached {statistics.median(ra):.2f} [{ra[0]:.2f}-{ra[-1]:.2f}]", flush=True)
dist.destroy_process_group()
