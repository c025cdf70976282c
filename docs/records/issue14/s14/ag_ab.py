# One build's all_gather_into_tensor times (p50 of per-call µs over a few hundred calls), plain tensors:
# out of place with the input written once, out of place and in place with the input written before each call.
import json, statistics, sys, time, torch, torch.distributed as dist
import tunedist
torch.set_num_threads(1)
dist.init_process_group("tuned")
r, w = dist.get_rank(), dist.get_world_size()
def p50(fn, iters):
    for _ in range(10): fn()
    dist.barrier()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(ts) * 1e6], dtype=torch.float64); dist.all_reduce(t)
    return t.item() / w
res = {}
for nbytes in [int(x) for x in sys.argv[1].split(",")]:
    n = nbytes // 4; b = n // w
    iters = max(40, min(1000, (256 << 20) // nbytes // 2))
    out = torch.empty(n); inp = torch.full((b,), float(r + 1))
    mine = out.narrow(0, r * b, b)
    res[f"oop {nbytes}"] = p50(lambda: dist.all_gather_into_tensor(out, inp), iters)
    res[f"oop fresh {nbytes}"] = p50(lambda: (inp.fill_(float(r + 1)), dist.all_gather_into_tensor(out, inp)), iters)
    res[f"ip fresh {nbytes}"] = p50(lambda: (mine.fill_(float(r + 1)), dist.all_gather_into_tensor(out, mine)), iters)
    assert torch.equal(out, torch.arange(1, w + 1, dtype=torch.float32).repeat_interleave(b))
if r == 0:
    print(json.dumps(res))
dist.destroy_process_group()
