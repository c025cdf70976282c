# One job, groups that differ only in TUNEDIST_BROADCAST_STREAM_BELOW_BYTES (0: the root copies into its slot as the
# slot-store chooser says, as before; default 512 KiB: streaming below it), plus one with TUNEDIST_SLOT_STORES=cached.
# Broadcast from rank 0, loop mean per call averaged over ranks, rounds interleaved; median and range of the ratios.
#   torchrun --standalone --nproc_per_node=2 bcast_ab.py [sizes]
import os, sys, time, statistics, torch, torch.distributed as dist, tunedist
sizes = [int(s[:-1]) << (10 if s[-1] == 'K' else 20) for s in (sys.argv[1] if len(sys.argv) > 1 else "16K,64K,256K,512K,1M,4M").split(",")]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfgs = {"before": {"TUNEDIST_BROADCAST_STREAM_BELOW_BYTES": "0"}, "now": {}}
groups = {}
for name, env in cfgs.items():
    os.environ.pop("TUNEDIST_BROADCAST_STREAM_BELOW_BYTES", None); os.environ.update(env)
    groups[name] = dist.new_group(backend="tuned")
R = int(os.environ.get("ROUNDS", "9"))
for nb in sizes:
    iters = max(20, min(3000, (128 << 20) // nb // 4))
    bufs = {m: torch.full((nb // 4,), float(rank)) for m in groups}
    fns = {m: (lambda t=bufs[m], g=g: dist.broadcast(t, src=0, group=g)) for m, g in groups.items()}
    for m, f in fns.items():
        for _ in range(10): f()
        assert bool((bufs[m] == 0).all())
    per = {m: [] for m in fns}
    for r in range(R):
        for m, f in (fns.items() if r % 2 == 0 else reversed(list(fns.items()))):
            dist.barrier(); f()
            a = time.perf_counter()
            for _ in range(iters): f()
            t = torch.tensor([(time.perf_counter() - a) / iters * 1e6], dtype=torch.float64)
            dist.all_reduce(t); per[m].append(t.item() / world)
    if rank == 0:
        rs = sorted(n / b for n, b in zip(per["now"], per["before"]))
        print(f"broadcast {nb:>9}  before {statistics.median(per['before']):8.1f}  now {statistics.median(per['now']):8.1f} us"
              f"   now/before {statistics.median(rs):.2f} [{rs[0]:.2f}-{rs[-1]:.2f}]", flush=True)
dist.destroy_process_group()
