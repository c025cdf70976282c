"""Benchmark of tunedist's C++ DDP communication hooks against torch's Python hooks, measured side by side.

    python benchmarks/bench_hooks.py --json hooks.json            # both parts
    python benchmarks/bench_hooks.py --part hook --iters 30       # hook time only

Part "hook": the time of one hook call per bucket, summed over a step's buckets, communication excluded by running
at world size 1 (gloo; its allreduce is a no-op there, and both hooks make the same number of calls). The buckets
are DDP's own (captured from a real backward pass) of a fixed model of 52 parameter tensors, none larger than
512x512. Every call starts from the same gradients (restored, untimed). Ours is the drop-in module, i.e. the
same C++ code the native hook runs plus one Python call per bucket. Torch's hook and ours (and, for PowerSGD, the
matrix work below) take turns step by step, so that they see the same load; each reports the median
over --iters steps of its wall time (the figure compared with the target) and of its process CPU time (all
threads: the part of a hook that runs on gloo's thread included), which a loaded machine disturbs less.
PowerSGD lines also show the "matrix work" alone, as a fraction of torch's whole hook time: the matrix products
and orthogonalisations per compressed gradient (orthogonalise Q, P = M Q, orthogonalise P, Q = M^T P,
M = P Q^T) with torch's ATen calls, and with ours (tunedist's low-rank kernels, which read M once per product;
BLAS is 4-5x slower at ranks 2-4).

Part "e2e": DDP step time (forward, backward, optimizer) at world size 2 on a communication-bound model (large
layers, batch 4): `tuned` + our PowerSGD (native) against gloo without a hook, gloo + torch's PowerSGD and gloo +
our PowerSGD. Every configuration runs with the same bucket layout, one DDP bucket for the whole model
(bucket_cap_mb=E2E_BUCKET_CAP_MB: an explicit cap also caps the first bucket, see tunedist/tune/candidates.py),
checked after the warm-up from DDP's reducer. One bucket is what lets torch's hook run on gloo: it starts its
P and Q allreduces from future callbacks, so with several buckets they can interleave with DDP's allreduce of the
next bucket in a different order on each rank (gloo then aborts on a size mismatch or hangs). Median over --steps
steps after a warm-up that passes start_powerSGD_iter. Each configuration runs in its own pair of processes; one
that fails is reported as FAILED with its error and the others still run.

Timings on a loaded machine are noisy: compare the ratios of one run, and report the load (uptime) with them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from _common import load_avg, run_meta, write_json


def hook_model() -> nn.Sequential:
    """26 Linear layers (52 tensors), weights between 256x256 and 512x512."""
    dims = [512, 256, 512, 384, 512, 256, 384, 512, 512, 256, 256, 512, 384, 384, 512, 256, 512, 384, 512, 256, 384,
            512, 512, 256, 256, 512, 384]
    return nn.Sequential(*[nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])


def capture_buckets(model: nn.Module):
    """DDP's gradient buckets after one backward (world size 1), with a copy of their gradients."""
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415

    ddp = DDP(model)
    buckets = []

    def capture(state, bucket):
        buckets.append(bucket)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, capture)
    for _ in range(2):  # the second step runs on the rebuilt buckets
        buckets.clear()
        ddp(torch.randn(8, 512)).square().mean().backward()
    return [(b, b.buffer().clone()) for b in buckets]


def hook_step(hook, state, buckets):
    """One step: every bucket restored (untimed), then hooked; returns the summed (wall, process CPU) seconds."""
    wall = cpu = 0.0
    for bucket, grads in buckets:
        bucket.buffer().copy_(grads)
        t0, c0 = time.perf_counter(), time.process_time()
        hook(state, bucket).wait()
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
    return wall, cpu


def matrix_step(work, ours: bool):
    """Per compressed gradient M: orthogonalise Q, P = M Q, orthogonalise P, Q = M^T P, M = P Q^T, with torch's
    ATen calls or with tunedist's kernels. Returns (wall, process CPU) seconds."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize  # noqa: PLC0415

    from tunedist._C import _hooks  # noqa: PLC0415

    t0, c0 = time.perf_counter(), time.process_time()
    for matrix, q, p in work:
        if ours:
            m2, q2, p2 = matrix[0], q[0], p[0]
            _hooks.orthogonalize(q, 0.0)
            _hooks.multiply_mq(m2, q2, p2)
            _hooks.orthogonalize(p, 0.0)
            _hooks.multiply_mtp(m2, p2, q2)
            _hooks.write_pqt(m2, p2, q2)
            continue
        _orthogonalize(q)
        torch.bmm(matrix, q, out=p)
        _orthogonalize(p)
        torch.bmm(matrix.transpose(1, 2), p, out=q)
        torch.bmm(p, q.transpose(1, 2), out=matrix)
    return time.perf_counter() - t0, time.process_time() - c0


def matrix_work(buckets, rank: int) -> list:
    """Copies of the gradients torch's hook compresses at `rank` (min_compression_rate 2), with their P and Q."""
    work = []
    for bucket, _ in buckets:
        for grad in bucket.gradients():
            n = grad.shape[0] if grad.dim() else 1
            m = grad.numel() // max(n, 1)
            r = min(n, m, rank)
            if grad.numel() and (n + m) * r * 2 < n * m:
                work.append((grad.detach().reshape(1, n, m).clone(), torch.randn(1, m, r), torch.empty(1, n, r)))
    return work


def time_interleaved(contenders: dict, iters: int) -> dict:
    """Median (wall, CPU) seconds per contender (label -> zero-argument step function). The contenders take turns
    step by step, in an order rotated every step, so that they see the same machine load."""
    labels = list(contenders)
    samples = {label: [] for label in labels}
    for step in range(iters):
        for k in range(len(labels)):
            label = labels[(step + k) % len(labels)]
            samples[label].append(contenders[label]())
    return {label: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for label, v in samples.items()}


def hook_cases():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_default  # noqa: PLC0415
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd  # noqa: PLC0415

    from tunedist.hooks import default as td_default  # noqa: PLC0415
    from tunedist.hooks import powerSGD as td_psgd  # noqa: PLC0415

    cases = [(name, 0.8, (getattr(torch_default, f"{name}_compress_hook"), lambda: None),
              (getattr(td_default, f"{name}_compress_hook"), lambda: None)) for name in ("fp16", "bf16")]
    for rank in (1, 2, 4):
        for warm in (True, False):
            opts = dict(matrix_approximation_rank=rank, start_powerSGD_iter=2, warm_start=warm)
            cases.append((f"powersgd_r{rank}_{'warm' if warm else 'cold'}", 0.5,
                          (torch_psgd.powerSGD_hook, lambda o=opts: torch_psgd.PowerSGDState(None, **o)),
                          (td_psgd.powerSGD_hook, lambda o=opts: td_psgd.PowerSGDState(None, **o))))
    return cases


def _end_group() -> None:
    """destroy_process_group, made safe for the interpreter's exit. gloo's worker thread drops its last work after
    the work completes; the work may hold the last reference to a tensor Python owns (torch's hooks make theirs in
    Python), which needs the GIL. Left to the interpreter's exit, that thread takes the GIL during finalisation and
    the process aborts ("terminate called without an active exception"). So the cycles that keep the group alive
    (DDP, the hooks' states) are collected, and the GIL is left free for a moment, while the interpreter is whole."""
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
    time.sleep(0.2)


def run_hook_part(args) -> list[dict]:
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    torch.manual_seed(0)
    buckets = capture_buckets(hook_model())
    results = []
    for name, target, (torch_hook, torch_state), (our_hook, our_state) in hook_cases():
        contenders = {}
        for label, hook, make_state in (("torch", torch_hook, torch_state), ("tunedist", our_hook, our_state)):
            state = make_state()
            if state is not None:
                state.iter = 2  # compress from the first timed call (warm start builds its memories then)
            contenders[label] = lambda h=hook, st=state, b=buckets: hook_step(h, st, b)
        if name.startswith("powersgd"):
            rank = int(name.split("_")[1][1:])
            for label, ours in (("aten_matrix", False), ("our_matrix", True)):
                work = matrix_work(buckets, rank)
                contenders[label] = lambda w=work, o=ours: matrix_step(w, o)
        time_interleaved(contenders, 2)  # warm-up
        measured = time_interleaved(contenders, args.iters)
        (torch_wall, torch_cpu), (our_wall, our_cpu) = measured["torch"], measured["tunedist"]
        ratio, cpu_ratio = our_wall / torch_wall, our_cpu / torch_cpu
        result = {"case": name, "torch_ms": torch_wall * 1e3, "tunedist_ms": our_wall * 1e3, "ratio": ratio,
                  "torch_cpu_ms": torch_cpu * 1e3, "tunedist_cpu_ms": our_cpu * 1e3, "cpu_ratio": cpu_ratio,
                  "target": target, "met": ratio <= target}
        line = (f"{name:18s} torch {torch_wall * 1e3:7.2f} ms tunedist {our_wall * 1e3:7.2f} ms ratio {ratio:4.2f} "
                f"(CPU {cpu_ratio:4.2f}; target <= {target})")
        if "aten_matrix" in measured:
            aten_wall, ours_wall = measured["aten_matrix"][0], measured["our_matrix"][0]
            result.update(aten_matrix_ms=aten_wall * 1e3, our_matrix_ms=ours_wall * 1e3,
                          aten_matrix_ratio=aten_wall / torch_wall, our_matrix_ratio=ours_wall / torch_wall)
            line += (f"  matrix work of torch's hook time: ATen {aten_wall / torch_wall:4.2f}, "
                     f"ours {ours_wall / torch_wall:4.2f}")
        results.append(result)
        print(line, flush=True)
    del contenders, buckets
    _end_group()
    return results


# ---------------------------------------------------------------------------------------------------------------

E2E_OPTS = dict(matrix_approximation_rank=2, start_powerSGD_iter=2, warm_start=True)
E2E_BUCKET_CAP_MB = 1024  # > the model's 64 MiB of gradients: one bucket in every configuration


def e2e_model() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)])


def _e2e_steps(rank: int, group, install, steps: int, warmup: int) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415

    torch.manual_seed(0)
    ddp = DDP(e2e_model(), process_group=group, bucket_cap_mb=E2E_BUCKET_CAP_MB)
    install(ddp, group)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(4, 2048, generator=torch.Generator().manual_seed(rank))
    times = []
    for step in range(warmup + steps):
        dist.barrier(group)
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
        if step == warmup - 1:
            _check_one_bucket(ddp, rank)
    return statistics.median(times)


def _check_one_bucket(ddp, rank: int) -> None:
    """Raises unless DDP's (rebuilt) buckets are one bucket, the same layout in every configuration."""
    reducer = getattr(ddp, "reducer", None)
    if not hasattr(reducer, "_get_zeros_like_grad_buckets"):  # private; present in torch 2.11-2.15
        raise RuntimeError(f"bench_hooks e2e: rank {rank}: cannot check DDP's bucket layout on torch "
                           f"{torch.__version__} (no Reducer._get_zeros_like_grad_buckets)")
    count = len(reducer._get_zeros_like_grad_buckets())
    if count != 1:
        raise RuntimeError(f"bench_hooks e2e: rank {rank}: expected one DDP bucket with bucket_cap_mb="
                           f"{E2E_BUCKET_CAP_MB}, got {count}; raise E2E_BUCKET_CAP_MB")


def _e2e_configs():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd  # noqa: PLC0415

    import tunedist.hooks as td_hooks  # noqa: PLC0415

    return {
        "gloo_no_hook": ("gloo", lambda ddp, g: None),
        "tuned_tunedist_powersgd": ("tuned", lambda ddp, g: td_hooks.register(ddp, "powersgd", **E2E_OPTS)),
        "gloo_tunedist_powersgd": ("gloo", lambda ddp, g: td_hooks.register(ddp, "powersgd", **E2E_OPTS)),
        "gloo_torch_powersgd": ("gloo", lambda ddp, g: ddp.register_comm_hook(
            torch_psgd.PowerSGDState(g, **E2E_OPTS), torch_psgd.powerSGD_hook)),
    }


def _e2e_worker(rank: int, world: int, init_file: str, name: str, steps: int, out_file: str) -> None:
    torch.set_num_threads(1)
    import tunedist  # noqa: F401,PLC0415

    backend, install = _e2e_configs()[name]
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    result = _e2e_steps(rank, None, install, steps, warmup=3)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(result, f)
    _end_group()


def run_e2e_part(args) -> dict:
    times, failures = {}, {}
    for name in _e2e_configs():
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "e2e.json")
            try:
                mp.spawn(_e2e_worker, args=(2, os.path.join(tmp, "init"), name, args.steps, out), nprocs=2)
                with open(out) as f:
                    times[name] = json.load(f)
            except Exception as exc:  # noqa: BLE001 - reported, the other configurations still run
                failures[name] = f"{type(exc).__name__}: {exc}"
    summary = {"step_ms": {k: v * 1e3 for k, v in times.items()}, "failures": failures}
    for k, v in summary["step_ms"].items():
        print(f"{k:26s} {v:9.2f} ms/step")
    for k, v in failures.items():
        print(f"{k:26s} FAILED: {v}")
    ours = times.get("tuned_tunedist_powersgd")
    for ref in ("gloo_no_hook", "gloo_torch_powersgd", "gloo_tunedist_powersgd"):
        if ours is not None and ref in times:
            summary[f"ratio_vs_{ref}"] = ours / times[ref]
            print(f"tuned + tunedist PowerSGD / {ref}: {ours / times[ref]:.2f}")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["hook", "e2e", "all"], default="all")
    parser.add_argument("--iters", type=int, default=20, help="timed steps of the hook part")
    parser.add_argument("--steps", type=int, default=10, help="timed DDP steps of the end-to-end part")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the hook part")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import tunedist  # noqa: F401,PLC0415  (registers "tuned")

    report = {**run_meta(), "load": load_avg(), "threads": args.threads}
    if args.part in ("hook", "all"):
        report["hook"] = run_hook_part(args)
    if args.part in ("e2e", "all"):
        report["e2e"] = run_e2e_part(args)
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
