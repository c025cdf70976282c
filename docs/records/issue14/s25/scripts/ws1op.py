import torch, torch.distributed as dist, tunedist, time, sys
dist.init_process_group(sys.argv[1], rank=0, world_size=1, init_method="tcp://127.0.0.1:29591")
t=torch.ones(1024); name=dist.group.WORLD.group_name
op=torch.ops.tunedist.all_reduce_.default; wt=torch.ops._c10d_functional.wait_tensor.default
for f,n in ((lambda: op(t,"sum",name),"op"),(lambda: wt(t),"wait_tensor"),(lambda: tunedist.all_reduce(t),"wrapper")):
    for _ in range(5000): f()
    best=1e9
    for r in range(5):
        s=time.perf_counter()
        for _ in range(100000): f()
        best=min(best,(time.perf_counter()-s)/100000*1e6)
    print(sys.argv[1], n, "%.2f"%best)
