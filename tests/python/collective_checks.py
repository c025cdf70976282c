"""The collective checks of test_collectives.py, part 1: the Checker and the reductions (all_reduce and its
coalesced form, broadcast, reduce, reduce_scatter). Each check runs inside every rank of a launch and compares with
closed-form values computed from every rank's deterministic inputs, bit for bit."""

from __future__ import annotations

import hashlib
import time
import traceback
from collections import defaultdict

import torch
import torch.distributed as dist

from dist_utils import input_kind, make_input, make_op, mismatch, reference, tensor_bits

# 300_001 elements: above the 256 KiB one-shot limit for every dtype (the two-shot path), more than one
# 1 MiB slot for 4- and 8-byte types (several chunks), and divisible by no world size > 1 (uneven slices).
SIZES = (0, 1, 1001, 300_001)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)
FLOAT_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM")
INT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
BOOL_OPS = ("SUM", "MAX", "MIN", "PRODUCT")



class Checker:
    """Records mismatches per section instead of stopping at the first; every message names the rank."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self.failures: dict[str, list[str]] = defaultdict(list)
        self.digests: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self.ran: list[str] = []
        self.seconds: dict[str, float] = {}
        self.section = ""

    def fail(self, msg: str) -> None:
        if len(self.failures[self.section]) < 25:
            self.failures[self.section].append(f"rank {self.rank}: {msg}")

    def equal(self, actual: torch.Tensor, expected: torch.Tensor, what: str) -> bool:
        problem = mismatch(actual, expected)
        if problem:
            self.fail(f"{what}: {problem}")
        return not problem

    def true(self, cond: bool, what: str) -> None:
        if not cond:
            self.fail(what)

    def digest(self, name: str, t: torch.Tensor) -> None:
        self.digests[self.section].append((name, hashlib.sha1(tensor_bits(t).numpy().tobytes()).hexdigest()))

    def run(self, name: str, fn) -> None:
        self.section = name
        self.ran.append(name)
        start = time.monotonic()
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - reported with the section; later sections still run
            self.fail("raised:\n" + traceback.format_exc())
        self.seconds[name] = time.monotonic() - start


def section_problems(section: str, world_size: int, results: list) -> list[str]:
    """What the ranks' Checker results of one launch say went wrong in `section`: a rank that did not run it, its
    failures, and results that differ bitwise from rank 0's (every rank must end with bit-identical results)."""
    problems = []
    for rank, res in enumerate(results):
        if section not in res["ran"]:
            problems.append(f"rank {rank}: section did not run")
        problems.extend(res["failures"].get(section, []))
    digests = [res["digests"].get(section, []) for res in results]
    for rank in range(1, world_size):
        for (name, d0), (_, dr) in zip(digests[0], digests[rank]):
            if d0 != dr:
                problems.append(f"{name}: rank {rank}'s result differs bitwise from rank 0's")
    return problems


def _reduce_cases():
    for dtype in FLOATS:
        for op in FLOAT_OPS:
            yield dtype, op
    for dtype in INTS:
        for op in INT_OPS:
            yield dtype, op
    for op in BOOL_OPS:
        yield torch.bool, op


def check_all_reduce(c: Checker) -> None:
    w = c.world_size
    for dtype, op in _reduce_cases():
        kind = input_kind(op)
        for n in SIZES:
            inputs = [make_input(dtype, n, r, "ar", kind) for r in range(w)]
            t = inputs[c.rank].clone()
            dist.all_reduce(t, op=make_op(op))
            name = f"all_reduce {op} {dtype} n={n}"
            c.equal(t, reference(op, inputs), name)
            c.digest(name, t)


def check_all_reduce_coalesced(c: Checker) -> None:
    w = c.world_size
    for dtype, op in ((torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int64, "MAX")):
        shapes = [(3, 5), (0,), (1001,), (7, 0, 2), (300_001,)]
        inputs = [[make_input(dtype, int(torch.Size(s).numel()), r, f"arc{i}").view(s) for i, s in
                   enumerate(shapes)] for r in range(w)]
        ts = [x.clone() for x in inputs[c.rank]]
        dist.all_reduce_coalesced(ts, op=make_op(op))
        for i, t in enumerate(ts):
            c.equal(t, reference(op, [inputs[r][i] for r in range(w)]), f"all_reduce_coalesced {op} {dtype} "
                    f"tensor {i} shape {shapes[i]}")


def check_broadcast(c: Checker) -> None:
    for root in range(c.world_size):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8):
            for n in SIZES:
                t = make_input(dtype, n, c.rank, "bc")
                dist.broadcast(t, src=root)
                c.equal(t, make_input(dtype, n, root, "bc"), f"broadcast root={root} {dtype} n={n}")


def check_reduce(c: Checker) -> None:
    w = c.world_size
    for root in range(w):
        for dtype, op in ((torch.float32, "SUM"), (torch.bfloat16, "SUM"), (torch.int32, "MAX"),
                          (torch.float64, "PRODUCT")):
            for n in SIZES:
                inputs = [make_input(dtype, n, r, "red", input_kind(op)) for r in range(w)]
                t = inputs[c.rank].clone()
                dist.reduce(t, dst=root, op=make_op(op))
                what = f"reduce {op} root={root} {dtype} n={n}"
                if c.rank == root:
                    c.equal(t, reference(op, inputs), what)
                else:
                    c.equal(t, inputs[c.rank], what + " (non-root tensor must be unchanged)")


def check_reduce_scatter(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype, op in ((torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int32, "MAX"),
                      (torch.float16, "PREMUL_SUM"), (torch.int8, "SUM")):
        for n in SIZES:
            blocks = [[make_input(dtype, n, r, f"rs{p}") for p in range(w)] for r in range(w)]
            expected = reference(op, [blocks[r][rank] for r in range(w)])
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, [b.clone() for b in blocks[rank]], op=make_op(op))
            c.equal(out, expected, f"reduce_scatter {op} {dtype} n={n}")
            # reduce_scatter_tensor; its input is the concatenation of the blocks.
            inp = torch.cat(blocks[rank])
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp.clone(), op=make_op(op))
            c.equal(out, expected, f"reduce_scatter_tensor {op} {dtype} n={n}")
            # ... with the output aliasing our own block of the input.
            if n > 0:
                inp2 = inp.clone()
                own = inp2.chunk(w)[rank]
                dist.reduce_scatter_tensor(own, inp2, op=make_op(op))
                c.equal(own, expected, f"reduce_scatter_tensor output=input.chunk(w)[rank] {op} {dtype} n={n}")
    # Coalesced reduce_scatter_tensor.
    specs = [(torch.float32, 1001), (torch.float32, 0), (torch.float32, 300_001), (torch.float32, 3)]
    outs = [torch.empty(n, dtype=dt) for dt, n in specs]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for i, ((dt, n), out) in enumerate(zip(specs, outs)):
            dist.reduce_scatter_tensor(out, make_input(dt, w * n, rank, f"rsc{i}"))
    cm.wait()
    for i, ((dt, n), out) in enumerate(zip(specs, outs)):
        full = [make_input(dt, w * n, r, f"rsc{i}") for r in range(w)]
        expected = reference("SUM", [f[rank * n:(rank + 1) * n] for f in full])
        c.equal(out, expected, f"coalesced reduce_scatter_tensor {dt} n={n}")
