"""The ops `python -m tunedist.bench` measures, one record per op as nccl-tests' struct testColl: the variants, how
S and busbw follow from the count and the world size, and the buffers with their closed-form expected values.
Conventions: tunedist.bench's docstring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64, "int32": torch.int32,
          "int64": torch.int64}
REDOPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
# Inputs repeat with this prime period, so a chunk misplaced by a power-of-two offset shows up as wrong elements.
PERIOD = 17


def _pattern(rank: int, start: int) -> torch.Tensor:
    """x(r, i) = (3i + 5r) mod 17 + 1 for i = start .. start + 16: one period of rank r's input from index start."""
    return ((torch.arange(PERIOD) + start) * 3 + rank * 5) % PERIOD + 1


def _tile(period: torch.Tensor, n: int, dtype) -> torch.Tensor:
    return period.to(dtype).repeat(n // PERIOD + 1)[:n]


def _reduced(world: int, start: int, redop: str) -> torch.Tensor:
    per_rank = torch.stack([_pattern(r, start) for r in range(world)])
    return {"sum": per_rank.sum(0), "max": per_rank.amax(0), "min": per_rank.amin(0)}[redop]


@dataclass(frozen=True)
class Buffers:
    """One point's tensors: fill() writes this rank's inputs, call() runs the op once, after which `out` must equal
    `expected` on this rank."""

    call: Callable[[], object]
    fill: Callable[[], object]
    out: torch.Tensor
    expected: torch.Tensor


@dataclass(frozen=True)
class Collective:
    """One measured op, as nccl-tests' struct testColl: its name, the variants measured, how S and busbw follow from
    the count and the world size, and its buffers."""

    name: str
    variants: tuple[bool, ...]  # in-place flags measured, out-of-place first
    summary_inplace: bool  # the variant the summary and the plot compare
    reduces: bool  # takes --op (the redop column); the others print "none"
    whole_array: bool  # S = n x count x typesize (the gathered or scattered array), else count x typesize
    busbw_factor: Callable[[int], float]  # busbw = algbw x busbw_factor(n)
    # (rank, world, inplace, count, dtype, redop, comm) -> Buffers; comm: a contender's calls (contenders.py), whose
    # empty() allocates every buffer passed to the op (symmetric ones for tuned+sym); expected values are torch's
    buffers: Callable[[int, int, bool, int, torch.dtype, str, object], Buffers]

    def nbytes(self, count: int, itemsize: int, world: int) -> int:
        return count * itemsize * (world if self.whole_array else 1)


def _own_input(inp, rank: int, n: int, dtype):
    def fill():
        return inp.copy_(_tile(_pattern(rank, 0), n, dtype))
    return fill


def _all_reduce_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(count, dtype)
    out = inp if inplace else comm.empty(count, dtype)
    expected = _tile(_reduced(world, 0, redop), count, dtype)

    def call():
        if not inplace:
            out.copy_(inp)  # torch's all_reduce works in place: out of place is the caller's copy plus that
        comm.all_reduce(out, REDOPS[redop])
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _broadcast_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(count, dtype)
    out = inp if inplace else comm.empty(count, dtype)
    expected = _tile(_pattern(0, 0), count, dtype)

    def call():
        comm.broadcast(out, 0)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _all_gather_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    out = comm.empty(world * count, dtype)
    inp = out.narrow(0, rank * count, count) if inplace else comm.empty(count, dtype)
    expected = torch.cat([_tile(_pattern(r, 0), count, dtype) for r in range(world)])

    def call():
        comm.all_gather_into_tensor(out, inp)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _reduce_scatter_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(world * count, dtype)
    out = inp.narrow(0, rank * count, count) if inplace else comm.empty(count, dtype)
    expected = _tile(_reduced(world, rank * count, redop), count, dtype)

    def call():
        comm.reduce_scatter_tensor(out, inp, REDOPS[redop])
    return Buffers(call, _own_input(inp, rank, world * count, dtype), out, expected)


# One record per op, in sweep order. torch's all_reduce and broadcast work in place only (see the docstring).
COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", variants=(False, True), summary_inplace=True, reduces=True, whole_array=False,
               busbw_factor=lambda n: 2 * (n - 1) / n, buffers=_all_reduce_buffers),
    Collective("all_gather", variants=(False, True), summary_inplace=False, reduces=False, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_all_gather_buffers),
    Collective("reduce_scatter", variants=(False, True), summary_inplace=False, reduces=True, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_reduce_scatter_buffers),
    Collective("broadcast", variants=(True,), summary_inplace=True, reduces=False, whole_array=False,
               busbw_factor=lambda n: 1.0, buffers=_broadcast_buffers),
)}
OPS = tuple(COLLECTIVES)


def _all_to_all_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(world * count, dtype)
    out = comm.empty(world * count, dtype)
    # Block q of rank r's input is x(r, q * count + i); block q of our output is rank q's block `rank`.
    expected = torch.cat([_tile(_pattern(q, rank * count), count, dtype) for q in range(world)])

    def call():
        comm.all_to_all_single(out, inp)
    return Buffers(call, _own_input(inp, rank, world * count, dtype), out, expected)


def _reduce_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    # In place, as torch's reduce: the root's tensor ends with the reduction. The others' tensors are undefined after
    # it (gloo uses them as scratch), so only the root has elements to check.
    t = comm.empty(count, dtype)
    out = t if rank == 0 else t.new_empty(0)
    expected = _tile(_reduced(world, 0, redop), count, dtype) if rank == 0 else out.clone()

    def call():
        comm.reduce(t, 0, REDOPS[redop])
    return Buffers(call, _own_input(t, rank, count, dtype), out, expected)


def _gather_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(count, dtype)
    out = comm.empty(world * count, dtype) if rank == 0 else inp
    expected = (torch.cat([_tile(_pattern(r, 0), count, dtype) for r in range(world)]) if rank == 0
                else _tile(_pattern(rank, 0), count, dtype))

    def call():
        comm.gather(inp, list(out.chunk(world)) if rank == 0 else None, 0)
    return Buffers(call, _own_input(inp, rank, count, dtype), out, expected)


def _scatter_buffers(rank, world, inplace, count, dtype, redop, comm) -> Buffers:
    inp = comm.empty(world * count, dtype)
    out = comm.empty(count, dtype)
    expected = _tile(_pattern(0, rank * count), count, dtype)

    def call():
        comm.scatter(out, list(inp.chunk(world)) if rank == 0 else None, 0)
    return Buffers(call, _own_input(inp, rank, world * count, dtype), out, expected)


# The other collectives of nccl-tests (alltoall, reduce, gather, scatter), measured when asked for by name: S is the
# whole array for all of them but reduce; roots are rank 0.
MORE_COLLECTIVES = {c.name: c for c in (
    Collective("all_to_all", variants=(False,), summary_inplace=False, reduces=False, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_all_to_all_buffers),
    Collective("reduce", variants=(True,), summary_inplace=True, reduces=True, whole_array=False,
               busbw_factor=lambda n: 1.0, buffers=_reduce_buffers),
    Collective("gather", variants=(False,), summary_inplace=False, reduces=False, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_gather_buffers),
    Collective("scatter", variants=(False,), summary_inplace=False, reduces=False, whole_array=True,
               busbw_factor=lambda n: (n - 1) / n, buffers=_scatter_buffers),
)}
# Every op the benchmarks take; OPS (the four above) is the default.
ALL_COLLECTIVES = {**COLLECTIVES, **MORE_COLLECTIVES}
ALL_OPS = tuple(ALL_COLLECTIVES)
VARIANTS = {name: c.variants for name, c in ALL_COLLECTIVES.items()}  # in-place flags measured per op
PRIMARY_INPLACE = {name: c.summary_inplace for name, c in ALL_COLLECTIVES.items()}


def count_wrong(bufs: Buffers) -> int:
    """Writes the inputs, calls the op and counts this rank's elements that differ from the closed form."""
    bufs.fill()
    bufs.call()
    return int((bufs.out != bufs.expected).sum())
