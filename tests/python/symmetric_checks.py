"""The checks of test_symmetric.py, part 1: the four zero-copy collectives on symmetric buffers and ranks that
disagree on symmetry, with the helpers every part uses. Each check runs inside every rank of a launch
(with TUNEDIST_SYMMETRIC_MIN_BYTES=0, so small buffers run zero-copy too) and compares with values computed from
every rank's deterministic inputs, bit for bit, and with the copying path on ordinary tensors.

``expect_path`` proves which path a call took: the heap counts every zero-copy operation (zero_copy_ops) and
every operation that all ranks restarted on the copying path because some rank's buffer was not symmetric
(copy_restarts), on every rank.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

import tunedist
from collective_checks import Checker
from dist_utils import SHM_DIR, SHM_PREFIX, make_input, make_op, reference

FLOATS = (torch.float32, torch.bfloat16, torch.float64)
DTYPES = (*FLOATS, torch.int32)
REDUCE_CASES = [(d, op) for d in FLOATS for op in ("SUM", "MAX", "AVG", "PREMUL_SUM")] + [
    (torch.int32, "SUM"), (torch.int32, "MAX")]
# all_reduce and broadcast: elements; 1 and 7 leave most ranks' slices of the zero-copy all_reduce empty, and
# 1_000_003 divides by no world size.
SIZES = (1, 7, 1_000_003)
# all_gather_into_tensor and reduce_scatter_tensor: elements per rank.
BLOCKS = (1, 7, 250_001)
SENTINEL = -7.0  # fills the parts of a symmetric tensor around a view that a collective must not touch

# Every /dev/shm name of tunedist this rank has mapped, for the parent's leak check after the job, and what was
# wrong with any of them the first time this rank saw it (a mode other than 0600, another owner, no uid prefix).
SEEN_SHM: set[str] = set()
NOT_PRIVATE: list[str] = []


def mapped_shm() -> set[str]:
    """/dev/shm names of tunedist segments this process maps now (/proc/self/maps), unlinked ones included."""
    names = set()
    marker = f"{SHM_DIR}/{SHM_PREFIX}"
    with open("/proc/self/maps") as maps:
        for line in maps:
            i = line.find(marker)
            if i >= 0:
                names.add(line[i + len(str(SHM_DIR)) + 1:].split()[0])  # without " (deleted)"
    for name in names - SEEN_SHM:
        _check_private(name)
    SEEN_SHM.update(names)
    return names


def _check_private(name: str) -> None:
    try:
        st = os.stat(SHM_DIR / name)
    except FileNotFoundError:
        return  # already unlinked: nobody can open it any more
    uid = os.getuid()
    if not name.startswith(f"{SHM_PREFIX}{uid}_") or st.st_mode & 0o777 != 0o600 or st.st_uid != uid:
        NOT_PRIVATE.append(f"{name}: mode {oct(st.st_mode & 0o777)}, owner {st.st_uid} (expected "
                           f"{SHM_PREFIX}{uid}_..., 0o600, owner {uid})")


def shm_exists(name: str) -> bool:
    return os.path.exists(SHM_DIR / name)


def sym(size, dtype: torch.dtype = torch.float32, group=None) -> torch.Tensor:
    """tunedist.symmetric_empty, noting the chunks this rank maps."""
    t = tunedist.symmetric_empty(size, dtype=dtype, group=group)
    mapped_shm()
    return t


def sym_copy(src: torch.Tensor, group=None) -> torch.Tensor:
    t = sym(tuple(src.shape), src.dtype, group)
    t.copy_(src)
    return t


@contextlib.contextmanager
def expect_path(c: Checker, what: str, zero_copy: int, restarts: int = 0, group=None):
    """The calls inside ran `zero_copy` zero-copy operations and `restarts` restarts on `group`'s heap."""
    before = tunedist.symmetric_heap_stats(group)
    yield
    after = tunedist.symmetric_heap_stats(group)
    dz = after["zero_copy_ops"] - before["zero_copy_ops"]
    dr = after["copy_restarts"] - before["copy_restarts"]
    c.true((dz, dr) == (zero_copy, restarts), f"{what}: zero_copy_ops +{dz} and copy_restarts +{dr}, expected "
           f"+{zero_copy} and +{restarts}")


# ---------------------------------------------------------------------------------------------------------------
# The four collectives: closed-form values, the copying path bit for bit, and the zero-copy path taken.


def check_all_reduce(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype, op in REDUCE_CASES:
        for n in SIZES:
            name = f"all_reduce {op} {dtype} n={n}"
            inputs = [make_input(dtype, n, r, "sym_ar") for r in range(w)]
            plain = inputs[rank].clone()
            with expect_path(c, name + " (ordinary tensor)", zero_copy=0):
                dist.all_reduce(plain, op=make_op(op))
            t = sym_copy(inputs[rank])
            with expect_path(c, name, zero_copy=1):
                dist.all_reduce(t, op=make_op(op))
            c.equal(t, reference(op, inputs), name)
            c.equal(t, plain, name + ": symmetric vs copying path")
            c.digest(name, t)


def check_all_gather_into_tensor(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype in DTYPES:
        for n in BLOCKS:
            name = f"all_gather_into_tensor {dtype} n={n}"
            mine = make_input(dtype, n, rank, "sym_ag")
            expected = torch.cat([make_input(dtype, n, p, "sym_ag") for p in range(w)])
            plain = torch.empty(w * n, dtype=dtype)
            with expect_path(c, name + " (ordinary tensors)", zero_copy=0):
                dist.all_gather_into_tensor(plain, mine)
            # FSDP2's in-place all-gather: the input is our own block of the symmetric output.
            out = sym(w * n, dtype)
            own = out.view(w, n)[rank]
            own.copy_(mine)
            with expect_path(c, name + " in place", zero_copy=1):
                dist.all_gather_into_tensor(out, own)
            c.equal(out, expected, name + " in place")
            c.equal(out, plain, name + " in place: symmetric vs copying path")
            c.digest(name, out)
            out2 = sym((w, n), dtype)
            with expect_path(c, name + " (ordinary input)", zero_copy=1):
                dist.all_gather_into_tensor(out2, mine)
            c.equal(out2.view(-1), expected, name + " (ordinary input)")
            inp, out3 = sym_copy(mine), sym(w * n, dtype)
            with expect_path(c, name + " (separate symmetric input)", zero_copy=1):
                dist.all_gather_into_tensor(out3, inp)
            c.equal(out3, expected, name + " (separate symmetric input)")


def check_reduce_scatter_tensor(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype, op in REDUCE_CASES:
        for n in BLOCKS:
            name = f"reduce_scatter_tensor {op} {dtype} n={n}"
            full = [make_input(dtype, w * n, r, "sym_rs") for r in range(w)]
            expected = reference(op, [f[rank * n:(rank + 1) * n] for f in full])
            plain = torch.empty(n, dtype=dtype)
            with expect_path(c, name + " (ordinary tensors)", zero_copy=0):
                dist.reduce_scatter_tensor(plain, full[rank].clone(), op=make_op(op))
            inp = sym_copy(full[rank])
            out = torch.empty(n, dtype=dtype)
            with expect_path(c, name + " (ordinary output)", zero_copy=1):
                dist.reduce_scatter_tensor(out, inp, op=make_op(op))
            c.equal(out, expected, name + " (ordinary output)")
            c.equal(out, plain, name + ": symmetric vs copying path")
            c.equal(inp, full[rank], name + ": the input must be left as it was")
            out_sym = sym(n, dtype)  # FSDP2 allocates both buffers from the heap
            with expect_path(c, name + " (symmetric output)", zero_copy=1):
                dist.reduce_scatter_tensor(out_sym, inp, op=make_op(op))
            c.equal(out_sym, expected, name + " (symmetric output)")
            # The output is our own block of the input.
            inp2 = sym_copy(full[rank])
            own = inp2.view(w, n)[rank]
            with expect_path(c, name + " (output = own block of the input)", zero_copy=1):
                dist.reduce_scatter_tensor(own, inp2, op=make_op(op))
            c.equal(own, expected, name + " (output = own block of the input)")
            for p in range(w):
                if p != rank:
                    c.equal(inp2.view(w, n)[p], full[rank].view(w, n)[p], f"{name}: block {p} of the input changed")


def check_broadcast(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for i, dtype in enumerate(DTYPES):
        for j, n in enumerate(SIZES):
            root = (i + j) % w
            name = f"broadcast root={root} {dtype} n={n}"
            mine = make_input(dtype, n, rank, "sym_bc")
            plain = mine.clone()
            with expect_path(c, name + " (ordinary tensor)", zero_copy=0):
                dist.broadcast(plain, src=root)
            t = sym_copy(mine)
            with expect_path(c, name, zero_copy=1):
                dist.broadcast(t, src=root)
            c.equal(t, make_input(dtype, n, root, "sym_bc"), name)
            c.equal(t, plain, name + ": symmetric vs copying path")
            c.digest(name, t)


# ---------------------------------------------------------------------------------------------------------------
# Ranks that disagree: some buffers symmetric, some not. Each runner does one call, symmetric or not, and returns
# (result, expected).

MIXED_N = 1001


def _mixed_all_reduce(rank: int, w: int, use_sym: bool):
    inputs = [make_input(torch.float32, MIXED_N, r, "mx_ar") for r in range(w)]
    t = sym_copy(inputs[rank]) if use_sym else inputs[rank].clone()
    dist.all_reduce(t)
    return t, reference("SUM", inputs)


def _mixed_all_gather(rank: int, w: int, use_sym: bool):
    mine = make_input(torch.bfloat16, MIXED_N, rank, "mx_ag")
    if use_sym:
        out = sym(w * MIXED_N, torch.bfloat16)
        own = out.view(w, MIXED_N)[rank]
        own.copy_(mine)
        dist.all_gather_into_tensor(out, own)
    else:
        out = torch.empty(w * MIXED_N, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, mine)
    return out, torch.cat([make_input(torch.bfloat16, MIXED_N, p, "mx_ag") for p in range(w)])


def _mixed_reduce_scatter(rank: int, w: int, use_sym: bool):
    n = MIXED_N
    full = [make_input(torch.float64, w * n, r, "mx_rs") for r in range(w)]
    inp = sym_copy(full[rank]) if use_sym else full[rank].clone()
    out = inp.view(w, n)[rank] if use_sym else torch.empty(n, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
    return out, reference("AVG", [f[rank * n:(rank + 1) * n] for f in full])


def _mixed_broadcast(rank: int, w: int, use_sym: bool):
    mine = make_input(torch.int32, MIXED_N, rank, "mx_bc")
    t = sym_copy(mine) if use_sym else mine
    dist.broadcast(t, src=0)
    return t, make_input(torch.int32, MIXED_N, 0, "mx_bc")


MIXED_OPS = {"all_reduce": _mixed_all_reduce, "all_gather_into_tensor": _mixed_all_gather,
             "reduce_scatter_tensor AVG": _mixed_reduce_scatter, "broadcast": _mixed_broadcast}


def mixed_patterns(w: int) -> dict[str, set[int]]:
    """Which ranks pass symmetric buffers, by case name."""
    patterns = {"only rank 0 symmetric": {0}, f"only rank {w - 1} symmetric": {w - 1}}
    if w > 2:
        patterns["all but rank 1 symmetric"] = set(range(w)) - {1}
    return patterns


def check_mixed(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for pattern, sym_ranks in mixed_patterns(w).items():
        for op, run in MIXED_OPS.items():
            what = f"{op}, {pattern}"
            with expect_path(c, what, zero_copy=0, restarts=1):
                actual, expected = run(rank, w, rank in sym_ranks)
            c.equal(actual, expected, what)
            with expect_path(c, what + ", then every rank symmetric", zero_copy=1):
                actual, expected = run(rank, w, True)
            c.equal(actual, expected, what + ", then every rank symmetric")
    # A non-contiguous view of a symmetric tensor on rank 0 (staged through an ordinary copy) against contiguous
    # symmetric buffers elsewhere.
    inputs = [make_input(torch.float32, MIXED_N, r, "mx_nc") for r in range(w)]
    base = sym(2 * MIXED_N)
    base.fill_(SENTINEL)
    t = base[::2] if rank == 0 else base[:MIXED_N]
    t.copy_(inputs[rank])
    with expect_path(c, "all_reduce, a strided view on rank 0", zero_copy=0, restarts=1):
        dist.all_reduce(t)
    c.equal(t, reference("SUM", inputs), "all_reduce, a strided view on rank 0")
    rest = base[1::2] if rank == 0 else base[MIXED_N:]
    c.true(bool((rest == SENTINEL).all()), "all_reduce, a strided view on rank 0: wrote outside the view")
