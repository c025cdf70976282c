# per op: fake PG (c10d floor), tuned world size 1, tuned world size 2; interleaved rounds, median of medians
import statistics, sys, time, torch, torch.distributed as dist, tunedist
import torch.testing._internal.distributed.fake_pg
def us(call, n):
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); call(); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)*1e6
dist.init_process_group("gloo")
r=dist.get_rank(); w=dist.get_world_size()
G={"fake":dist.new_subgroups(group_size=1,backend="fake")[0],
   "ws1":dist.new_subgroups(group_size=1,backend="tuned")[0],
   "ws2":dist.new_group(backend="tuned")}
sizes=[int(s) for s in sys.argv[1].split(",")]
rounds=int(sys.argv[2]) if len(sys.argv)>2 else 5
res={}
def rows(nb):
    out={}
    for gname,g in G.items():
        ws=dist.get_world_size(g); n=nb//4
        inp=torch.ones(n//ws); o=torch.empty(n); t=torch.ones(n); rin=torch.ones(n); rout=torch.empty(n//ws)
        out[("ar",gname)]=lambda g=g,t=t: dist.all_reduce(t,group=g)
        out[("ag",gname)]=lambda g=g,o=o,inp=inp: dist.all_gather_into_tensor(o,inp,group=g)
        out[("rs",gname)]=lambda g=g,rout=rout,rin=rin: dist.reduce_scatter_tensor(rout,rin,group=g)
        out[("bc",gname)]=lambda g=g,t=t: dist.broadcast(t,dist.get_global_rank(g,0),group=g)
    return out
for _ in range(rounds):
  for nb in sizes:
    it=max(50,min(3000,(32<<20)//nb))
    for k,c in rows(nb).items():
      for _ in range(5): c()
      dist.barrier(group=G["ws2"])
      res.setdefault((nb,)+k,[]).append(us(c,it))
if r==0:
  print(f"# median over {rounds} rounds of p50 us; cols fake ws1 ws2 | ws1-fake ws2-ws1")
  for nb in sizes:
    for op in ("ar","ag","rs","bc"):
      m={g:statistics.median(res[(nb,op,g)]) for g in G}
      print(f"{nb:>8} {op} {m['fake']:7.2f} {m['ws1']:7.2f} {m['ws2']:7.2f} | {m['ws1']-m['fake']:6.2f} {m['ws2']-m['ws1']:6.2f}")
dist.destroy_process_group()
