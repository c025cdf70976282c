"""Point-to-point operations of the ``tuned`` backend (send, recv, isend/irecv, recv from any source,
batch_isend_irecv), in real processes.

One launch per world size runs every check inside the ranks (``_run_p2p_checks``); each pytest test then reports one
section of that run, so a failure names its case and rank while the suite pays for process start-up only once per
world size. Data is a deterministic function of (case, sender rank), so a tensor from the wrong sender, tag or
message shows. The failure paths (size mismatch, sending to oneself) have their own launches.
"""

from __future__ import annotations

import traceback
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist

from dist_utils import launch

DTYPES = [
    pytest.param(torch.float32, id="f32"),
    pytest.param(torch.float64, id="f64"),
    pytest.param(torch.float16, id="f16"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.int8, id="i8"),
    pytest.param(torch.uint8, id="u8"),
    pytest.param(torch.int16, id="i16"),
    pytest.param(torch.int32, id="i32"),
    pytest.param(torch.int64, id="i64"),
    pytest.param(torch.bool, id="bool"),
    pytest.param(torch.complex64, id="c64"),
    pytest.param(torch.complex128, id="c128"),
    pytest.param(torch.float8_e4m3fn, id="f8e4m3"),
]
# 0 and 1 element, an odd count, and one that needs several passes through a 256 KiB ring for every dtype.
COUNTS = (0, 1, 1001, 300_001)
LARGE_BYTES = 64 << 20
P2P_WORLD_SIZES = (2, 3)


def make_tensor(dtype: torch.dtype, n: int, rank: int, salt: int = 0) -> torch.Tensor:
    """Sender `rank`'s tensor for a case: differs per rank, salt and index, and round-trips exactly in dtype."""
    base = (torch.arange(n, dtype=torch.int64) * 7 + rank * 31 + salt * 13) % 97
    if dtype == torch.bool:
        return base % 3 == 0
    if dtype.is_complex:
        return torch.complex(base.double(), -base.double()).to(dtype)
    if dtype == torch.float8_e4m3fn:
        return (base % 16).to(torch.float32).to(dtype)
    return base.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------------------------
# The checks, one function per section; each runs on every rank in the same order.


class Checker:
    """Records failures per section instead of stopping at the first; every message names the rank."""

    def __init__(self, rank: int, world: int):
        self.rank = rank
        self.world = world
        self.section = ""
        self.failures: dict[str, list[str]] = defaultdict(list)

    def expect(self, ok: bool, msg: str) -> None:
        if not ok:
            self.failures[self.section].append(f"rank {self.rank}: {msg}")

    def run(self, name: str, fn, *args) -> None:
        self.section = name
        self.failures[name] = []
        try:
            fn(self, *args)
        except Exception:  # noqa: BLE001 - reported with the section; later sections still run
            self.failures[name].append(f"rank {self.rank}: raised\n{traceback.format_exc()}")
        # Keep sections apart: a late message of one section must never meet a receive of the next.
        dist.barrier()


def check_dtype(c: Checker, dtype: torch.dtype) -> None:
    """Blocking send/recv along the ring r -> r+1, every count; odd ranks receive first to avoid a cycle."""
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    for i, n in enumerate(COUNTS):
        out = make_tensor(dtype, n, c.rank, i)
        got = torch.empty(n, dtype=dtype)
        if c.rank % 2 == 0:
            dist.send(out, nxt, tag=i)
            dist.recv(got, prv, tag=i)
        else:
            dist.recv(got, prv, tag=i)
            dist.send(out, nxt, tag=i)
        c.expect(same_bits(got, make_tensor(dtype, n, prv, i)), f"{_dtype_id(dtype)} x {n}: wrong data from {prv}")


def check_tags(c: Checker) -> None:
    """Rank 0 isends tag 1 then tag 2 to every other rank; they irecv tag 2 first."""
    if c.rank == 0:
        works = []
        for dst in range(1, c.world):
            works.append(dist.isend(make_tensor(torch.float32, 100, 0, 1), dst, tag=1))
            works.append(dist.isend(make_tensor(torch.float32, 5000, 0, 2), dst, tag=2))
        for w in works:
            w.wait()
    else:
        a, b = torch.empty(100), torch.empty(5000)
        wb = dist.irecv(b, 0, tag=2)
        wa = dist.irecv(a, 0, tag=1)
        wb.wait()
        wa.wait()
        c.expect(same_bits(a, make_tensor(torch.float32, 100, 0, 1)), "tag 1 got the wrong message")
        c.expect(same_bits(b, make_tensor(torch.float32, 5000, 0, 2)), "tag 2 got the wrong message")


def check_any_source(c: Checker) -> None:
    """Every rank but 0 sends twice to 0, which receives without naming the source; recv returns the sender."""
    n = 33
    if c.rank != 0:
        for k in range(2):
            dist.send(make_tensor(torch.int64, n, c.rank, k), 0, tag=3)
        return
    seen = defaultdict(int)
    for _ in range(2 * (c.world - 1)):
        t = torch.empty(n, dtype=torch.int64)
        src = dist.recv(t, tag=3)
        c.expect(0 < src < c.world, f"recv from any source returned {src}")
        c.expect(same_bits(t, make_tensor(torch.int64, n, src, seen[src])),
                 f"message {seen[src]} of rank {src} is wrong (or out of order)")
        seen[src] += 1
    c.expect(all(seen[r] == 2 for r in range(1, c.world)), f"messages per sender: {dict(seen)}")


def check_batch_ring(c: Checker) -> None:
    """batch_isend_irecv: every rank sends to the next and receives from the previous, at once."""
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    for n in (10, 200_000):
        out = make_tensor(torch.float32, n, c.rank, 7)
        got = torch.empty(n)
        ops = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, out, nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.expect(same_bits(got, make_tensor(torch.float32, n, prv, 7)), f"ring exchange of {n}: wrong data")


def check_large(c: Checker) -> None:
    """64 MiB from rank 0 to rank 1 and back."""
    n = LARGE_BYTES // 4
    if c.rank == 0:
        out = torch.arange(n, dtype=torch.int32)
        dist.send(out, 1)
        back = torch.empty(n, dtype=torch.int32)
        dist.recv(back, 1)
        c.expect(torch.equal(back, out * 3), "64 MiB round trip: wrong data")
    elif c.rank == 1:
        got = torch.empty(n, dtype=torch.int32)
        dist.recv(got, 0)
        c.expect(torch.equal(got, torch.arange(n, dtype=torch.int32)), "64 MiB: wrong data")
        dist.send(got * 3, 0)


def check_non_contiguous(c: Checker) -> None:
    """A transposed, strided send into a strided receive view."""
    if c.rank == 0:
        src = make_tensor(torch.float64, 600, 0, 9).reshape(20, 30)
        dist.send(src.t()[::2], 1)  # 15 x 20, not contiguous
    elif c.rank == 1:
        holder = torch.full((15, 40), -1.0, dtype=torch.float64)
        view = holder[:, ::2]  # 15 x 20, not contiguous
        dist.recv(view, 0)
        want = make_tensor(torch.float64, 600, 0, 9).reshape(20, 30).t()[::2]
        c.expect(torch.equal(view, want), "non-contiguous receive: wrong data")
        c.expect(bool((holder[:, 1::2] == -1).all()), "non-contiguous receive wrote between the strides")


def check_collective_after(c: Checker) -> None:
    """The collectives still work after point-to-point traffic."""
    t = torch.ones(4)
    dist.all_reduce(t)
    c.expect(bool((t == c.world).all()), f"all_reduce after p2p gave {t.tolist()}")


def _run_p2p_checks(rank: int, world: int) -> dict[str, list[str]]:
    c = Checker(rank, world)
    for p in DTYPES:
        dtype = p.values[0]
        c.run(f"dtype-{_dtype_id(dtype)}", check_dtype, dtype)
    c.run("tags", check_tags)
    c.run("any-source", check_any_source)
    c.run("batch-ring", check_batch_ring)
    c.run("large", check_large)
    c.run("non-contiguous", check_non_contiguous)
    c.run("collective-after", check_collective_after)
    return dict(c.failures)


@pytest.fixture(scope="module", params=P2P_WORLD_SIZES, ids=lambda n: f"w{n}")
def p2p_run(request):
    world = request.param
    return world, launch(world, _run_p2p_checks, pg_timeout_s=60)


def _report(p2p_run, section: str) -> None:
    world, per_rank = p2p_run
    failures = [m for r in per_rank for m in r.get(section, [])]
    assert section in per_rank[0], f"section {section} did not run"
    assert not failures, f"world size {world}, {section}:\n" + "\n".join(failures)


@pytest.mark.parametrize("dtype", DTYPES)
def test_send_recv_every_dtype(p2p_run, dtype):
    _report(p2p_run, f"dtype-{_dtype_id(dtype)}")


@pytest.mark.parametrize("section", ["tags", "any-source", "batch-ring", "large", "non-contiguous",
                                     "collective-after"])
def test_p2p(p2p_run, section):
    _report(p2p_run, section)


# ---------------------------------------------------------------------------------------------------------------
# Failures.


def _size_mismatch(rank: int, world: int) -> list[str]:
    errors = []
    if rank == 0:
        dist.send(torch.ones(3), 1, tag=5)  # 12 bytes: out of our buffer, so the send itself succeeds
        dist.barrier()
        try:
            dist.send(torch.ones(3), 1, tag=6)
        except RuntimeError as e:
            errors.append(str(e))
        dist.send(torch.full((2,), 4.0), 1, tag=7)
    else:
        try:
            dist.recv(torch.empty(2), 0, tag=5)
        except RuntimeError as e:
            errors.append(str(e))
        dist.barrier()
        t = torch.empty(2)
        dist.recv(t, 0, tag=7)
        if not torch.equal(t, torch.full((2,), 4.0)):
            errors.append(f"the message after a mismatch is wrong: {t.tolist()}")
    return errors


def test_size_mismatch_raises_on_both_sides():
    sender, receiver = launch(2, _size_mismatch, pg_timeout_s=60)
    assert len(receiver) == 1, f"the mismatched recv did not raise: {receiver}"
    for part in ("12 bytes", "8 bytes", "tag 5", "rank 0", "rank 1"):
        assert part in receiver[0], f"the receiver's error does not mention {part!r}: {receiver[0]}"
    assert len(sender) == 1, f"the sender's next send did not raise: {sender}"
    for part in ("rank 1 rejected", "12 bytes", "8 bytes", "tag 5"):
        assert part in sender[0], f"the sender's error does not mention {part!r}: {sender[0]}"


def _self_and_bad_peers(rank: int, world: int) -> list[str]:
    messages = []
    t = torch.ones(2)
    for call in (lambda: dist.isend(t, rank), lambda: dist.irecv(t, rank),
                 lambda: dist.isend(t.to_sparse(), (rank + 1) % world)):
        try:
            call().wait()
            messages.append("no error")
        except (RuntimeError, ValueError) as e:
            messages.append(str(e))
    return messages


def test_self_and_bad_tensors_are_rejected():
    for msgs in launch(2, _self_and_bad_peers, pg_timeout_s=30):
        assert "sending to oneself is not supported" in msgs[0], msgs[0]
        assert "sending to oneself is not supported" in msgs[1], msgs[1]
        assert msgs[2] != "no error", "a sparse tensor was sent"
