import os, time, statistics, torch, torch.distributed as dist
import tunedist
dist.init_process_group("tuned")
rank=dist.get_rank(); ws=dist.get_world_size()
import deepspeed, deepspeed.comm as dscomm
deepspeed.init_distributed(dist_backend="gloo")  # DS's CPU accelerator uses ccl/gloo for init; shm op built on first use
g=dist.group.WORLD
name=g.group_name
fc=torch.ops._c10d_functional
def a(t): dist.all_reduce(t)
def b(t):
    fc.all_reduce_(t,"sum",name); fc.wait_tensor(t)
def c(t): dscomm.inference_all_reduce(t)
op=torch.ops.tunedist.all_reduce_.default
def d(t): op(t,"sum",name)
raw=torch.ops.deepspeed.inference_all_reduce_
def e(t): raw(t)
fns={"dist":a,"op":d,"ds":c,"dsraw":e}
for size in (4096,16384,65536):
    t=torch.ones(size//4)
    res={k:[] for k in fns}
    for k,f in fns.items():
        for _ in range(300): f(t)
    for r in range(9):
        for k,f in (fns.items() if r%2==0 else reversed(list(fns.items()))):
            dist.barrier()
            n=2000
            s=time.perf_counter()
            for _ in range(n): f(t)
            res[k].append((time.perf_counter()-s)/n*1e6)
    if rank==0:
        r=lambda a,b: statistics.median([x/y for x,y in zip(res[a],res[b])])
        print(size, '  '.join(f'{k} {statistics.median(v):.2f}' for k,v in res.items()), ' op/ds %.2f dist/ds %.2f op/dsraw %.2f dist/dsraw %.2f'%(r('op','ds'),r('dist','ds'),r('op','dsraw'),r('dist','dsraw')))
dist.destroy_process_group()
