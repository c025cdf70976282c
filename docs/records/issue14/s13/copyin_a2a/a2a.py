# all_to_all_single and scatter, p50 µs per size, inputs written before each call (untimed), 5 rounds.
import json, statistics, sys, time
import torch, torch.distributed as dist
import tunedist
torch.set_num_threads(1)
dist.init_process_group("tuned")
r, w = dist.get_rank(), dist.get_world_size()
res = {}
for nb in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20):
    n = nb // 4 // w * w
    src = torch.empty(n); dst = torch.empty(n)
    sc_in = [torch.empty(n // w) for _ in range(w)]; sc_out = torch.empty(n // w)
    def a2a(): dist.all_to_all_single(dst, src)
    def sc(): dist.scatter(sc_out, sc_in if r == 0 else None, src=0)
    def write_a2a(): src.fill_(float(r))
    def write_sc():
        if r == 0:
            for q, t in enumerate(sc_in): t.fill_(float(q + 1))
    for name, call, write in (("all_to_all_single", a2a, write_a2a), ("scatter", sc, write_sc)):
        write(); call()
        ok = (bool((dst.view(w, -1) == torch.arange(w, dtype=torch.float32).view(w, 1)).all()) if name == "all_to_all_single"
              else bool((sc_out == float(r + 1)).all()))
        assert ok, name
        iters = max(20, min(1000, (128 << 20) // nb // 4))
        rounds = []
        for _ in range(5):
            dist.barrier(); ts = []
            for _ in range(iters):
                write(); t0 = time.perf_counter(); call(); ts.append(time.perf_counter() - t0)
            rounds.append(statistics.median(ts) * 1e6)
        res[f"{name} {nb}"] = {"op": name, "bytes": nb, "p50_us": statistics.median(rounds), "rounds_us": rounds}
if r == 0:
    json.dump({"tunedist_file": tunedist.__file__, "points": res}, open(sys.argv[1], "w"), indent=1)
    for k, v in res.items(): print(f"{k:28s} {v['p50_us']:9.1f}")
dist.destroy_process_group()
