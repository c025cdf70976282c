import torch, torch.distributed as dist, tunedist, time, statistics
import torch.testing._internal.distributed.fake_pg
dist.init_process_group("gloo")
r=dist.get_rank()
fake=dist.new_subgroups(group_size=1, backend="fake")[0]
ws1=dist.new_subgroups(group_size=1, backend="tuned")[0]
tw=dist.new_group(backend="tuned")
fc=torch.ops._c10d_functional
t=torch.ones(1024)
def funcol(g):
    n=g.group_name
    def f(): fc.all_reduce_(t,"sum",n); fc.wait_tensor(t)
    return f
rows={"fake_funcol":funcol(fake),"ws1_funcol":funcol(ws1),"ws2_funcol":funcol(tw),"ws2_dist":lambda: dist.all_reduce(t,group=tw),"ws2_async":lambda: dist.all_reduce(t,group=tw,async_op=True).wait(),"ws2_op":lambda: tunedist.all_reduce(t,group=tw)}
res={k:[] for k in rows}
for k,f in rows.items():
    for _ in range(500): f()
for rd in range(7):
    for k,f in rows.items():
        dist.barrier(); s=time.perf_counter()
        for _ in range(3000): f()
        res[k].append((time.perf_counter()-s)/3000*1e6)
if r==0: print("  ".join(f"{k} {statistics.median(v):.2f}" for k,v in res.items()))
dist.destroy_process_group()
