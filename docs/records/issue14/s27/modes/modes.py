"""Session 27: 64 MiB all_reduce (NB) on 2 ranks, tuned groups with different settings (SETTINGS: auto, or VAR=VALUE,
comma-separated) and the all_reduce stand-in of tunedist.bench (bench_standin), taking turns round by round (ROUNDS,
ITERS calls each; order reversed every other round); per round the median call (us) and the memcpy probe before it.
    SETTINGS=auto,TUNEDIST_SLOT_STORES=cached,TUNEDIST_SLOT_STORES=streaming torchrun --standalone \
        --nproc_per_node=2 docs/records/issue14/s27/modes/modes.py"""
import os, sys, time, statistics, torch, torch.distributed as dist, tunedist
from tunedist.bench_standin import AllreduceStandin
dist.init_process_group("gloo")
r = dist.get_rank()
nb = int(os.environ.get("NB", 64<<20))
settings = [s.split("=",1) if "=" in s else (s, None) for s in os.environ.get("SETTINGS","auto,TUNEDIST_SLOT_STORES=cached,TUNEDIST_SLOT_STORES=streaming").split(",")]
groups = []
for name, val in settings:
    if val is not None: os.environ[name]=val
    groups.append((f"{name.replace('TUNEDIST_','')}={val}" if val else name, dist.new_group(backend="tuned")))
    if val is not None: del os.environ[name]
x = torch.zeros(nb//4)
s = AllreduceStandin(nb//4, torch.float32); assert s.check()==0
for _, g in groups:
    for _ in range(3): dist.all_reduce(x, group=g)
res = {n: [] for n,_ in groups}; res["standin"] = []
src=torch.ones(nb,dtype=torch.uint8); dst=torch.zeros_like(src); tunedist._C.copy_gbps(dst,src); mem=[]
ITERS=int(os.environ.get("ITERS",6))
for rnd in range(int(os.environ.get("ROUNDS",6))):
    res["standin"].append(s.time_us(3)["best"])
    dist.barrier(); mem.append(sorted(tunedist._C.copy_gbps(dst,src) for _ in range(3))[1])
    order = groups if rnd % 2 == 0 else groups[::-1]
    for n, g in order:
        dist.barrier(group=g)
        ts=[]
        for _ in range(ITERS):
            t0=time.perf_counter(); dist.all_reduce(x, group=g); ts.append(time.perf_counter()-t0)
        res[n].append(statistics.median(ts)*1e6)
if r==0:
    print(f"memcpy {' '.join(f'{m:.1f}' for m in mem)}")
    for n, v in res.items():
        print(f"{n:32s} " + " ".join(f"{t:7.0f}" for t in v) + f"   median {statistics.median(v):7.0f}  standin/it {statistics.median([a/b for a,b in zip(res['standin'],v)]):.2f}")
s.close()
dist.destroy_process_group()
