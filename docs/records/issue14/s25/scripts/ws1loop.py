import os, sys, time, torch, torch.distributed as dist
import tunedist
os.environ.setdefault("MASTER_ADDR","127.0.0.1"); os.environ.setdefault("MASTER_PORT","29533")
which=sys.argv[1]; n=int(sys.argv[2]); size=int(sys.argv[3]) if len(sys.argv)>3 else 1024
if which=="fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
else:
    dist.init_process_group(which, rank=0, world_size=1)
t=torch.ones(size)
for _ in range(1000): dist.all_reduce(t)
best=[]
for r in range(5):
    a=time.perf_counter()
    for _ in range(n): dist.all_reduce(t)
    best.append((time.perf_counter()-a)/n*1e6)
print(which, "us/call", sorted(best))
dist.destroy_process_group()
