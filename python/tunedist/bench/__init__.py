"""nccl-tests-style benchmark of the `tuned` backend against gloo (or any CPU c10d backend) and DeepSpeed's CPU
shared-memory all_reduce, interleaved in one run.

    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,gloo \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast -b 8 -e 256M -f 2 --json out.json --plot out.png
    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,gloo,deepspeed --ops all_reduce -b 4K -e 64M -f 4
    torchrun --nproc_per_node=1 -m tunedist.bench --device cuda --backends tuned,nccl   # CUDA buffers (one GPU)
    torchrun --nproc_per_node=2 -m tunedist.bench --backends tuned,tuned+sym \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast -b 64K -e 64M -f 4   # copying vs zero-copy

Contenders (tunedist.bench.contenders): each name in --backends is a c10d backend with a group of its own, or
`deepspeed`, deepspeed.comm.inference_all_reduce (pip install deepspeed; all_reduce only, its other ops are skipped
with a note; the bench sets DS_ACCELERATOR=cpu and LOCAL_SIZE when unset), or `tuned+sym`, a tuned group of its own
whose buffers (every tensor passed to the op: out-of-place inputs and outputs too) come from that group's symmetric
heap (tunedist.symmetric_empty) instead of torch.empty, so that its points from 64 KiB run zero-copy or copying as
the group measured them on this host per op and size class (tunedist.symmetric; with TUNEDIST_SYMMETRIC_MIN_BYTES
set, zero-copy from that S), or `tuned-op`, a tuned group of its own called through tunedist's operators
(tunedist.all_reduce and the others: the same engine, without torch.distributed's Python layer; all_reduce,
all_gather, reduce_scatter and broadcast), or `deepspeed-op`, DeepSpeed's kernel
torch.ops.deepspeed.inference_all_reduce_ called without its Python API (SUM only). The conventions follow nccl-tests
(its doc/PERFORMANCE.md; the figures measured with them: docs/performance.md):
- Interleaving: at each point (op, variant, size) every contender is checked and warmed up, then the contenders take
  turns, one timed loop each, for --rounds rounds (A B C A B C ...), so load drift on a shared machine hits them
  alike. Each loop starts after a barrier on the control group and one untimed call.
- time: the median over rounds of each round's mean time per op of a loop of back-to-back calls with no barrier
  between them (total / iters). It is averaged over ranks (-a 1, the nccl-tests default; -a 0 takes rank 0, 2 the
  min, 3 the max). p10/p50/p90/p99 are the percentiles of each rank's per-iteration times, pooled over the rounds (as
  gloo's benchmark reports them), reduced over ranks the same way.
- summary: every contender's time over the first one's, per round (round k of both ran back to back), as the median
  ratio and its spread (min-max over rounds).
- algbw = S / time with 1 GB = 1e9 B. busbw = algbw x factor:
      all_reduce      S = count x typesize (the per-rank buffer)          factor 2(n-1)/n
      all_gather      S = n x count x typesize (the gathered array)       factor (n-1)/n
      reduce_scatter  S = n x count x typesize (the array scattered)      factor (n-1)/n
      broadcast       S = count x typesize                                factor 1
    and, when named in --ops (roots rank 0; reduce in place, the others out of place):
      all_to_all      S = n x count x typesize (each rank's array)        factor (n-1)/n
      reduce          S = count x typesize                                factor 1
      gather          S = n x count x typesize (the gathered array)       factor (n-1)/n
      scatter         S = n x count x typesize (the array scattered)      factor (n-1)/n
  size(B) is S and count is the elements per rank (all_gather: its input; reduce_scatter: its output).
  collectives.ALL_COLLECTIVES holds one record per op with these facts and its buffers (nccl-tests' testColl).
- Out-of-place and in-place: torch's all_reduce and broadcast work in place only. The out-of-place all_reduce is the
  copy a caller needs (out.copy_(in)) plus the in-place op, and broadcast has only the in-place column. In place,
  all_gather's input is the rank's own chunk of the output and reduce_scatter's output is its chunk of the input.
  The summary compares all_reduce and broadcast in place, and all_gather and reduce_scatter out of place (reduce in
  place, all_to_all, gather and scatter out of place).
- #wrong: the elements that differ from the closed form after one verification call made before the warm-up (so
  never inside the timed loop), summed over ranks. Inputs are small integers, exact in every dtype, so any
  difference is an error. deepspeed is always checked, and a deepspeed point with wrong elements is not timed (its
  API returns wrong results silently: see contenders.DEEPSPEED_NOTES); the row says so, with #wrong.
- Iterations: -n and -w fix them. Otherwise the warm-up takes up to 5 calls and the loop is sized to take about
  --target-s seconds (3 to 1000 calls), from timings that all ranks agree on; each round runs that many.
- cpu: the CPU time of each rank's process over the timed loops (time.process_time(): every thread, the backend's
  own and the kernel's work for its sockets included) per op, summed over ranks (cpu_all_ranks_us; cpu_us is the
  mean per rank). Where the ranks share a machine of C cores, no op can take less than that sum / C of wall time:
  the summary prints it beside the times so a CPU-bound comparison shows as one.
- memcpy_gbps: the per-rank bandwidth of the engine's copy routine (tunedist._C.copy_gbps) while all ranks
  copy at once (buffers touched first, a barrier before each of 5 copies), probed before the first point; the
  median of each rank, then the mean over ranks. memcpy_gbps_end: the same probe after the last point (on a shared
  VM the probe moves 1.5x within minutes, so one probe says little about the minutes between). bound: the
  all_reduce ceiling of a two-shot algorithm with copy-in/out, 4(P-1)/(5P+1) x the mean of the two probes, and
  each backend's busbw over it at the largest size. At that point (the largest all_reduce, in place) the probe also
  takes a turn in every round, first, so memory speed is measured seconds from each timed loop
  (memcpy_gbps_rounds in its rows), and bound.beside_rounds holds each backend's busbw there over 4(P-1)/(5P+1) and
  over 4(P-1)/(3P+1) (a design that copies in only what peers need and reduces in place) x the probe of its own
  round: per round, their median and min-max. The memcpy probe copies within a core; a collective moves bytes
  between cores, which costs more where the ranks' CPUs sit far apart and less where they share a core's caches. So
  at the same point that design itself also takes a turn in every round, run with plain kernels on shared memory
  between the ranks (tunedist.bench.standin; CPU runs of 2 or more ranks): standin_us_rounds in the rows, and
  beside_rounds' "standin", the stand-in's time over each round's (> 1: the collective beats the design as these
  CPUs run it). Where the ranks cannot map each other's memory the notes say why.
- load_avg_start/end: os.getloadavg() on rank 0 before the first and after the last point.
- zero-copy (tuned+sym only): the growth of symmetric_heap_stats()["zero_copy_ops"] over a point (its check, warm-up
  and rounds; the least over ranks) next to the calls the point made, in the row (zero_copy_ops, calls,
  copy_restarts, zero_copy_expected: S >= TUNEDIST_SYMMETRIC_MIN_BYTES where it is set, on a one-host group) and as
  the path (zero-copy, copying or mixed: by default the group measures each op and size class, and a point's calls
  may include a probe window of every path). meta["symmetric"] has the run's totals, the path each measured class
  keeps with rank 0's timings, and the heap's (reserved_bytes and peak_in_use_bytes, the most over ranks). With
  TUNEDIST_SYMMETRIC_MIN_BYTES set, a point that must run zero-copy and did not, or a run with no zero-copy call, is
  printed as a WARNING (stdout and stderr).

Modules: __main__ (the command line and the run's metadata), sweep (the points, their checks, warm-up and
interleaved rounds, the memcpy probe), collectives (one record per op: S, busbw and the buffers), contenders (what
--backends names, and how each calls the ops), report (tables, ratios, the bound), symmetric (tuned+sym's zero-copy
accounting), standin (the all_reduce stand-in), plot (--plot).
"""
