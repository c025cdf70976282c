"""tunedist's main job: three workloads, each run side by side against what users run today, in one torchrun.

    torchrun --standalone --nproc_per_node=2 examples/main_job/run.py \
        [--json build/main_job.json] [--plot build/main_job.png] [--quick]

- DDP training (ddp.py): gloo + default DDP against tuned + the bucket tuner's choice + the hook it advises.
- FSDP2 training (fsdp2.py): fully_shard with bf16 mixed precision over gloo against tuned with symmetric buffers;
  step time and peak memory.
- Tensor-parallel decoding (tp_decode.py): a small transformer at batch 1, one all_reduce per layer per token, over
  gloo, tuned through dist.all_reduce, tunedist.all_reduce, and DeepSpeed's inference_all_reduce when DeepSpeed is
  installed; tokens/s and per-token p50/p99.
Within a workload the runs alternate step by step (or round by round), so load on the machine hits them alike, and
their results are checked equal (losses, generated tokens). Rank 0 prints one table (report.py), and writes the JSON
record and the breakdown figure (compute, exposed communication and optimizer, medians with p10/p90 whiskers).
CPU only; each rank uses one thread (torchrun sets OMP_NUM_THREADS=1 for several ranks, and so does this script).
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the workload modules, and examples/train_ddp.py

WORKLOADS = ("ddp", "fsdp2", "tp_decode")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {WORKLOADS}")
    p.add_argument("--quick", action="store_true", help="a few steps and tokens of each (for tests; not a timing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--ddp-steps", type=int, default=16, help="timed DDP steps per run (default 16)")
    p.add_argument("--ddp-warmup", type=int, default=3)
    p.add_argument("--fsdp-steps", type=int, default=12, help="timed FSDP2 steps per run (default 12)")
    p.add_argument("--fsdp-warmup", type=int, default=2)
    p.add_argument("--fsdp-vocab", type=int, default=8192)
    p.add_argument("--fsdp-d-model", type=int, default=256)
    p.add_argument("--fsdp-layers", type=int, default=4)
    p.add_argument("--fsdp-seq-len", type=int, default=32)
    p.add_argument("--fsdp-batch", type=int, default=4, help="sequences per rank and step (default 4)")
    p.add_argument("--tp-d-model", type=int, default=512)
    p.add_argument("--tp-layers", type=int, default=8)
    p.add_argument("--tp-heads", type=int, default=8)
    p.add_argument("--tp-vocab", type=int, default=4096)
    p.add_argument("--tp-prompt", type=int, default=16)
    p.add_argument("--tp-tokens", type=int, default=33, help="tokens per generation (the first comes from the "
                                                               "prefill and is not timed; default 33)")
    p.add_argument("--tp-rounds", type=int, default=4)
    p.add_argument("--deepspeed", choices=("auto", "on", "off"), default="auto",
                   help="the DeepSpeed contender of tp_decode: auto (when importable), on (required), off")
    p.add_argument("--json", help="rank 0 writes the record here")
    p.add_argument("--plot", help="rank 0 draws the breakdown figure here (needs matplotlib)")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown or not args.workloads:
        p.error(f"--workloads: choose from {WORKLOADS} (got {args.workloads})")
    if args.quick:
        args.ddp_steps, args.ddp_warmup, args.fsdp_steps, args.fsdp_warmup = 3, 1, 3, 1
        args.tp_tokens, args.tp_rounds, args.tp_layers, args.tp_d_model = 5, 2, 2, 128
        args.fsdp_vocab, args.fsdp_d_model, args.fsdp_layers, args.fsdp_seq_len = 4096, 64, 2, 8
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import common
    import torch
    import torch.distributed as dist

    import tunedist  # registers the "tuned" backend

    torch.set_num_threads(args.threads)
    mmap_fixed = common.fixed_mmap_threshold()
    dist.init_process_group("tuned")
    gloo_group = dist.new_group(backend="gloo")  # the baselines' group; also carries the job's own bookkeeping
    rank, world = dist.get_rank(), dist.get_world_size()

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[main job] {msg}", flush=True)

    import report

    record = {"machine": report.machine(), "world_size": world, "torch": torch.__version__,
              "tunedist": tunedist.version(), "threads_per_rank": torch.get_num_threads(),
              "malloc_mmap_threshold_fixed": mmap_fixed, "args": vars(args), "load": {"start": common.load()},
              "workloads": {}}
    try:
        for name in args.workloads:
            log(f"{name}: running (load {common.load()})")
            start = time.perf_counter()
            module = __import__(name)
            result = module.run(args, gloo_group, rank, world, log)
            result["wall_s"] = time.perf_counter() - start
            record["workloads"][name] = result
            record["load"][name] = common.load()
            log(f"{name}: done in {result['wall_s']:.1f} s; results matched: {result['check']['matched']}")
        dist.barrier(group=gloo_group)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        record["table"] = report.rows(record)
        print(report.table(record), flush=True)
        record["figure"] = args.plot
        if args.plot:
            report.plot(record, args.plot)
        if args.json:
            report.save_json(record, args.json)
    ok = all(w["check"]["matched"] for w in record["workloads"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
