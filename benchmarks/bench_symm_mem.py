"""torch's symmetric-memory API and c10d windows on CPU over `tuned`: put + signal round trips, and a one-shot
all_reduce written with torch's API against dist.all_reduce on the same group.

    torchrun --standalone --nproc_per_node=2 benchmarks/bench_symm_mem.py --json /tmp/symm_mem.json

Measured on the default `tuned` group (world size 2; the round trips run between ranks 0 and 1):
- round trip, per --rt-sizes (default 4K and 1M): rank 0 sends `size` bytes to rank 1 and rank 1 sends them back.
    symm_mem:  the sender copies into the peer's buffer (SymmetricMemory.get_buffer(peer, ...).copy_) and calls
               put_signal(peer); the receiver's wait_signal returns once the data is there.
    window:    Window.put(tensor, peer, 0) + Window.signal(peer); the receiver's Window.wait_signal.
    send_recv: dist.send / dist.recv on the same group (tuned's shared-memory rings), the two-sided reference.
  Time: the mean round trip of a loop of --rt-iters, on rank 0.
- all_reduce, per --ar-sizes (float32, default 4K, 64K, 1M): every rank all-reduces (sum) `size` bytes.
    one_shot_py:  written with torch's API only: barrier(); out = sum of get_buffer(p) over p (out.copy_ then
                  add_, in rank order); barrier(). The input is a symm_mem.empty tensor; the result lands in `out`.
    symm_mem_op:  torch.ops.symm_mem.one_shot_all_reduce(input, "sum", group_name) (tunedist's CPU kernel).
    all_reduce:   dist.all_reduce(t) on an ordinary tensor (tuned's copying path).
    all_reduce_symmetric: dist.all_reduce on the symm_mem.empty tensor (zero-copy from TUNEDIST_SYMMETRIC_MIN_BYTES).
  Time: the mean of a loop of --ar-iters calls, the slowest rank's; every result is checked against the closed
  form (rank r's input is r + 1 everywhere: the sum is P(P+1)/2).
Every measurement runs --rounds times; a round runs every mode once, in an order that rotates from round to round
so that load drift hits all alike. Reported: the median over rounds and [min-max], and per size the ratio
one_shot_py / all_reduce (and the others to all_reduce) taken within each round: median [min-max].
load: os.getloadavg() on rank 0 at the start and the end. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from _common import load_avg, loop_mean_s, over_ranks, parse_sizes, process_group, run_meta, spread, write_json

import tunedist

RT_MODES = ("symm_mem", "window", "send_recv")
AR_MODES = ("one_shot_py", "symm_mem_op", "all_reduce", "all_reduce_symmetric")


def round_trips(rank: int, size: int, iters: int, rounds: int) -> dict:
    """Seconds per round trip of each RT_MODES mode, one value per round (rank 0's loop; rank 1 only echoes)."""
    n = size // 4
    buf = symm_mem.empty(n, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(buf, dist.group.WORLD)
    win_buf = symm_mem.empty(n, dtype=torch.float32, device="cpu")
    win = dist.distributed_c10d._new_window(win_buf)
    src = torch.full((n,), float(rank + 1))
    peer_buf = hdl.get_buffer(1 - rank, (n,), torch.float32)
    recv = torch.empty(n)

    def symm_mem_rt():
        if rank == 0:
            peer_buf.copy_(src)
            hdl.put_signal(1)
            hdl.wait_signal(1)
        else:
            hdl.wait_signal(0)
            peer_buf.copy_(buf)
            hdl.put_signal(0)

    def window_rt():
        if rank == 0:
            win.put(src, 1, 0, False)
            win.signal(1, False)
            win.wait_signal(1, False)
        else:
            win.wait_signal(0, False)
            win.put(win_buf, 0, 0, False)
            win.signal(0, False)

    def send_recv_rt():
        if rank == 0:
            dist.send(src, 1)
            dist.recv(recv, 1)
        else:
            dist.recv(recv, 0)
            dist.send(recv, 0)

    calls = {"symm_mem": symm_mem_rt, "window": window_rt, "send_recv": send_recv_rt}
    for call in calls.values():  # warm-up: every mapping touched
        for _ in range(max(3, iters // 10)):
            call()
    # After the warm-up every buffer holds rank 0's data, echoed back to rank 0 by rank 1.
    ok = bool((buf == 1.0).all()) and bool((win_buf == 1.0).all()) and bool((recv == 1.0).all())
    times: dict[str, list[float]] = {m: [] for m in RT_MODES}
    for r in range(rounds):
        order = RT_MODES[r % len(RT_MODES):] + RT_MODES[:r % len(RT_MODES)]
        for mode in order:
            dist.barrier()
            times[mode].append(loop_mean_s(calls[mode], iters))
    dist.barrier()
    return {"times": times, "ok": ok}


def all_reduces(rank: int, world: int, size: int, iters: int, rounds: int) -> dict:
    """Seconds per call of each AR_MODES mode (the slowest rank's), one value per round, and whether every result
    matched the closed form."""
    n = size // 4
    group = dist.group.WORLD.group_name
    expected = world * (world + 1) / 2
    inp = symm_mem.empty(n, dtype=torch.float32, device="cpu").fill_(rank + 1)
    hdl = symm_mem.rendezvous(inp, dist.group.WORLD)
    bufs = [hdl.get_buffer(p, (n,), torch.float32) for p in range(world)]
    out = torch.empty(n)
    plain = torch.empty(n)
    sym = symm_mem.empty(n, dtype=torch.float32, device="cpu")

    def one_shot_py():
        hdl.barrier(channel=0)  # every rank's input is written
        out.copy_(bufs[0])
        for b in bufs[1:]:
            out.add_(b)
        hdl.barrier(channel=0)  # every rank has read ours

    def symm_mem_op():
        torch.ops.symm_mem.one_shot_all_reduce_out(inp, "sum", group, out)

    def all_reduce():
        plain.fill_(rank + 1)
        dist.all_reduce(plain)

    def all_reduce_symmetric():
        sym.fill_(rank + 1)
        dist.all_reduce(sym)

    # The refills keep every result checkable; one_shot_py and symm_mem_op refill nothing (their input stays), so
    # they get the same fill_ of an untouched tensor to pay for.
    scratch = torch.empty(n)

    def fill_then(call):
        def run():
            scratch.fill_(rank + 1)
            call()
        return run

    calls = {"one_shot_py": fill_then(one_shot_py), "symm_mem_op": fill_then(symm_mem_op), "all_reduce": all_reduce,
             "all_reduce_symmetric": all_reduce_symmetric}
    checks = {"one_shot_py": lambda: out, "symm_mem_op": lambda: out, "all_reduce": lambda: plain,
              "all_reduce_symmetric": lambda: sym}
    ok = True
    for mode, call in calls.items():
        out.zero_()
        call()
        ok = ok and bool((checks[mode]() == expected).all())
    zero_copy_before = tunedist.symmetric_heap_stats()["zero_copy_ops"]
    times: dict[str, list[float]] = {m: [] for m in AR_MODES}
    for r in range(rounds):
        order = AR_MODES[r % len(AR_MODES):] + AR_MODES[:r % len(AR_MODES)]
        for mode in order:
            dist.barrier()
            t = loop_mean_s(calls[mode], iters)
            times[mode].append(over_ranks([t], op=dist.ReduceOp.MAX)[0])
    zero_copy = tunedist.symmetric_heap_stats()["zero_copy_ops"] - zero_copy_before
    for mode, call in calls.items():
        out.zero_()
        call()
        ok = ok and bool((checks[mode]() == expected).all())
    return {"times": times, "ok": ok, "zero_copy_ops": zero_copy}


def ratio_spread(num: list[float], den: list[float]) -> dict:
    return spread([a / b for a, b in zip(num, den)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rt-sizes", type=parse_sizes, default=parse_sizes("4K,1M"))
    ap.add_argument("--ar-sizes", type=parse_sizes, default=parse_sizes("4K,64K,1M"))
    ap.add_argument("--rt-iters", type=int, default=2000)
    ap.add_argument("--ar-iters", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    record: dict = {"load_start": load_avg()}
    with process_group("tuned", args.threads) as (rank, world):
        if world != 2:
            raise SystemExit("bench_symm_mem.py: run it on 2 ranks (--nproc_per_node=2)")
        record["meta"] = run_meta()
        record["round_trip"] = {}
        for size in args.rt_sizes:
            res = round_trips(rank, size, args.rt_iters if size <= 65536 else max(50, args.rt_iters // 10),
                              args.rounds)
            ok = over_ranks([0.0 if res["ok"] else 1.0])[0] == 0
            med = {m: statistics.median(v) * 1e6 for m, v in res["times"].items()}
            record["round_trip"][str(size)] = {
                "us": {m: spread([x * 1e6 for x in v]) for m, v in res["times"].items()},
                "symm_mem_over_send_recv": ratio_spread(res["times"]["symm_mem"], res["times"]["send_recv"]),
                "window_over_send_recv": ratio_spread(res["times"]["window"], res["times"]["send_recv"]),
                "ok": ok}
            if rank == 0:
                print(f"round trip {size:>8} B: " + ", ".join(f"{m} {med[m]:.1f} us" for m in RT_MODES)
                      + f" (ok={ok})", flush=True)
        record["all_reduce"] = {}
        for size in args.ar_sizes:
            res = all_reduces(rank, world, size, args.ar_iters if size <= 65536 else max(50, args.ar_iters // 5),
                              args.rounds)
            ok = over_ranks([0.0 if res["ok"] else 1.0])[0] == 0
            t = res["times"]
            entry = {"us": {m: spread([x * 1e6 for x in v]) for m, v in t.items()},
                     "one_shot_py_over_all_reduce": ratio_spread(t["one_shot_py"], t["all_reduce"]),
                     "symm_mem_op_over_all_reduce": ratio_spread(t["symm_mem_op"], t["all_reduce"]),
                     "all_reduce_symmetric_over_all_reduce": ratio_spread(t["all_reduce_symmetric"], t["all_reduce"]),
                     "zero_copy_ops": res["zero_copy_ops"], "ok": ok}
            record["all_reduce"][str(size)] = entry
            if rank == 0:
                r = entry["one_shot_py_over_all_reduce"]
                print(f"all_reduce {size:>8} B: "
                      + ", ".join(f"{m} {statistics.median(t[m]) * 1e6:.1f} us" for m in AR_MODES)
                      + f"; one_shot_py/all_reduce {r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"
                      f" (ok={ok}, zero-copy ops {res['zero_copy_ops']})", flush=True)
        record["args"] = {k: v for k, v in vars(args).items() if k != "json"}
    record["load_end"] = load_avg()
    if rank == 0:
        print(f"load average: start {record['load_start']}, end {record['load_end']}")
        if args.json:
            write_json(args.json, record)


if __name__ == "__main__":
    main()
