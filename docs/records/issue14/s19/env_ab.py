# One job, tuned groups that differ only in the environment they were created with (A and B), all_reduce float32
# in place, taking turns round by round (order alternating), loop mean per call averaged over ranks.
#   A="TUNEDIST_CACHED_COPY_MAX_BYTES=1099511627776" B="" torchrun --standalone --nproc_per_node=2 env_ab.py 4M,16M,64M
import os, sys, time, statistics, torch, torch.distributed as dist, tunedist
sizes = [int(s[:-1]) << (10 if s[-1] == 'K' else 20) for s in sys.argv[1].split(",")]
op = sys.argv[2] if len(sys.argv) > 2 else "all_reduce"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
base = dict(os.environ)
groups = {}
for name in ("A", "B"):
    os.environ.clear(); os.environ.update(base)
    for kv in os.environ.get(name, "").split():
        k, v = kv.split("=", 1); os.environ[k] = v
    groups[name] = dist.new_group(backend="tuned")
os.environ.clear(); os.environ.update(base)
R = int(os.environ.get("ROUNDS", "7"))
for nb in sizes:
    iters = max(5, min(3000, (256 << 20) // nb // 4))
    if op == "all_reduce":
        bufs = {m: torch.ones(nb // 4) for m in groups}
        fns = {m: (lambda t=bufs[m], g=g: dist.all_reduce(t, group=g)) for m, g in groups.items()}
    else:
        bufs = {m: (torch.ones(nb // 4 // world), torch.empty(nb // 4)) for m in groups}
        fns = {m: (lambda t=bufs[m], g=g: dist.all_gather_into_tensor(t[1], t[0], group=g)) for m, g in groups.items()}
    for f in fns.values():
        for _ in range(3): f()
    per = {m: [] for m in fns}
    for r in range(R):
        for m, f in (fns.items() if r % 2 == 0 else reversed(list(fns.items()))):
            dist.barrier(); f()
            a = time.perf_counter()
            for _ in range(iters): f()
            t = torch.tensor([(time.perf_counter() - a) / iters * 1e6], dtype=torch.float64)
            dist.all_reduce(t); per[m].append(t.item() / world)
    if rank == 0:
        rs = sorted(b / a for a, b in zip(per["A"], per["B"]))
        print(f"{op} {nb:>9}  A {statistics.median(per['A']):9.1f}  B {statistics.median(per['B']):9.1f} us"
              f"   B/A {statistics.median(rs):.2f} [{rs[0]:.2f}-{rs[-1]:.2f}]", flush=True)
dist.destroy_process_group()
