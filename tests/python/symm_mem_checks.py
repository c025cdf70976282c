"""In-rank checks of torch's symmetric-memory API and c10d windows on CPU tensors of a tuned group
(test_symm_mem.py runs them). Every value is a closed form of the ranks' indices, so each rank knows what every
peer wrote; messages name the rank, the peer and the index."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch._C._distributed_c10d import _SymmetricMemory

import tunedist
from collective_checks import Checker

N = 1000  # elements: not a multiple of the cache line, so the two-shot slices are uneven


def _group_name() -> str:
    return dist.group.WORLD.group_name


def _tuned_cpu():
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _fill(t: torch.Tensor, rank: int, salt: int = 0) -> torch.Tensor:
    """Element i of rank r: r * 1000 + i + salt (exact in float32 for the sizes used)."""
    return t.copy_(torch.arange(t.numel(), dtype=torch.float64).add_(rank * 1000 + salt).to(t.dtype).view(t.shape))


def _expected(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    return _fill(torch.empty(n, dtype=dtype), rank, salt)


def check_allocator(c: Checker) -> None:
    t = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    c.true(t.device.type == "cpu" and t.shape == (N,) and t.dtype == torch.float32, f"empty gave {t.shape} {t.dtype}")
    c.true(symm_mem.is_symm_mem_tensor(t), "is_symm_mem_tensor(symm_mem.empty(...)) is False")
    c.true(not symm_mem.is_symm_mem_tensor(torch.empty(N)), "an ordinary tensor counts as symmetric memory")
    c.true(symm_mem.get_backend("cpu") == "TUNED", f"get_backend('cpu') = {symm_mem.get_backend('cpu')!r}")
    c.true(tunedist.is_symmetric(t), "a symm_mem.empty tensor is not in the tuned heap (tunedist.is_symmetric)")
    shaped = symm_mem.empty((3, 5), dtype=torch.bfloat16, device="cpu")
    c.true(shaped.shape == (3, 5) and shaped.is_contiguous(), f"empty((3, 5)) gave {shaped.shape}")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    c.true(not _SymmetricMemory.has_multicast_support(torch._C._autograd.DeviceType.CPU, 0),
           "_SymmetricMemory.has_multicast_support(CPU) is True")
    c.true(hdl.multicast_ptr == 0, f"multicast_ptr = {hdl.multicast_ptr}")
    for name in ("buffer_ptrs_dev", "signal_pad_ptrs_dev"):
        try:
            getattr(hdl, name)
            c.fail(f"{name} did not raise")
        except RuntimeError as exc:
            c.true("no device array" in str(exc), f"{name}: {exc}")


def check_rendezvous(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    t = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    c.true(hdl.rank == r and hdl.world_size == ws, f"rank/world_size {hdl.rank}/{hdl.world_size}")
    c.true(hdl.device.type == "cpu", f"device {hdl.device}")
    c.true(hdl.buffer_size >= N * 4, f"buffer_size {hdl.buffer_size}")
    c.true(hdl.offset == 0, f"offset {hdl.offset}")
    ptrs = hdl.buffer_ptrs
    c.true(len(ptrs) == ws and ptrs[r] == t.data_ptr(), f"buffer_ptrs {ptrs}, own {t.data_ptr()}")
    c.true(len(hdl.signal_pad_ptrs) == ws and len(set(hdl.signal_pad_ptrs)) == ws, "signal_pad_ptrs")
    again = symm_mem.rendezvous(t, _group_name())  # by name, cached: no communication
    c.true(again.buffer_ptrs == ptrs and again.signal_pad_ptrs == hdl.signal_pad_ptrs, "second rendezvous differs")
    _fill(t, r)
    hdl.barrier()
    for p in range(ws):
        c.equal(hdl.get_buffer(p, (N,), torch.float32), _expected(p, N, torch.float32), f"get_buffer({p})")
    c.true(hdl.get_buffer(r, (N,), torch.float32).data_ptr() == t.data_ptr(), "get_buffer(own) is not the tensor")
    hdl.barrier()  # nobody overwrites its buffer while a peer reads it


def check_views_offsets(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    t = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    _fill(t, r)
    hdl.barrier()
    for p in range(ws):
        view = hdl.get_buffer(p, (10, 7), torch.float32, storage_offset=101)
        c.equal(view, _expected(p, N, torch.float32)[101:171].view(10, 7), f"get_buffer({p}) 10x7 at 101")
        words = hdl.get_buffer(p, (N,), torch.int32)  # another dtype over the same bytes
        c.equal(words, _expected(p, N, torch.float32).view(torch.int32), f"get_buffer({p}) as int32")
        remote = hdl.get_remote_tensor(p, (N,), torch.float32)
        c.equal(remote, _expected(p, N, torch.float32), f"get_remote_tensor({p})")
    pad = hdl.get_signal_pad(r)
    c.true(pad.dtype == torch.uint32 and pad.numel() * 4 == symm_mem.get_signal_pad_size(), f"pad {pad.shape}")
    try:
        hdl.get_buffer(r, (N + 1,), torch.float32)
        c.fail("get_buffer past the allocation did not raise")
    except RuntimeError as exc:
        c.true("exceeds the allocated size" in str(exc), str(exc))
    hdl.barrier()
    # Writes through a view of a peer's buffer, at an offset, seen there after put_signal / wait_signal.
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    hdl.get_buffer(nxt, (5,), torch.float32, storage_offset=500 + r).fill_(float(-1 - r))
    hdl.put_signal(nxt)
    hdl.wait_signal(prv)
    c.equal(t[500 + prv:505 + prv], torch.full((5,), float(-1 - prv)), f"rank {prv}'s write through get_buffer")
    hdl.barrier()


def check_signals(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    t = symm_mem.empty(ws * 16, dtype=torch.int64, device="cpu")  # 16 slots per writer, reused every 16 rounds
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    channels = symm_mem.get_signal_pad_size() // 4 // ws  # one word per (channel, source rank)
    t.zero_()
    hdl.barrier(channel=1)
    for it in range(200):
        channel = it % 3
        # Ring: write our round number into the next rank's slot for us, then signal it. A slot is written again 16
        # rounds later, when put_signal on its channel has seen the reader consume a later round's signal.
        hdl.get_buffer(nxt, (ws * 16,), torch.int64)[r * 16 + it % 16] = it
        hdl.put_signal(nxt, channel=channel)
        hdl.wait_signal(prv, channel=channel)
        got = int(t[prv * 16 + it % 16])
        if got != it:
            c.fail(f"round {it}, channel {channel}: rank {prv} wrote {got}")
            break
    hdl.barrier(channel=channels - 1)  # the last channel the pad holds
    try:
        hdl.barrier(channel=channels)
        c.fail(f"barrier on channel {channels} (past the pad) did not raise")
    except RuntimeError as exc:
        c.true("out of range" in str(exc), str(exc))
    # A wait that nobody answers ends at its timeout naming the peer; the group stays usable.
    try:
        hdl.wait_signal(prv, channel=2, timeout_ms=300)
        c.fail("an unanswered wait_signal returned")
    except RuntimeError as exc:
        c.true("timed out" in str(exc) and f"from rank {prv}" in str(exc), str(exc))
    hdl.barrier()
    out = torch.ones(4)
    dist.all_reduce(out)
    c.equal(out, torch.full((4,), float(ws)), "all_reduce after a timed-out wait")


def check_interop(c: Checker) -> None:
    """tunedist.symmetric_empty and symm_mem.empty are one heap: each is rendezvoused and runs zero-copy."""
    r, ws = c.rank, c.world_size
    s = tunedist.symmetric_empty(N, dtype=torch.float32)
    hdl = symm_mem.rendezvous(s, dist.group.WORLD)
    _fill(s, r, salt=7)
    hdl.barrier()
    for p in range(ws):
        c.equal(hdl.get_buffer(p, (N,), torch.float32), _expected(p, N, torch.float32, salt=7), f"get_buffer({p})")
    hdl.barrier()
    t = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    _fill(t, r)
    before = tunedist.symmetric_heap_stats()
    dist.all_reduce(t)
    after = tunedist.symmetric_heap_stats()
    c.true(after["zero_copy_ops"] == before["zero_copy_ops"] + 1,
           f"all_reduce of a symm_mem.empty tensor: zero_copy_ops {before['zero_copy_ops']} -> "
           f"{after['zero_copy_ops']}")
    expected = sum(_expected(p, N, torch.float64) for p in range(ws)).to(torch.float32)
    c.equal(t, expected, "all_reduce of a symm_mem.empty tensor")


def check_operators(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    group = _group_name()
    t = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    total = sum(_expected(p, N, torch.float64) for p in range(ws)).to(torch.float32)
    _fill(t, r)
    c.equal(torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group), total, "one_shot_all_reduce")
    c.equal(t, _expected(r, N, torch.float32), "one_shot_all_reduce changed its input")
    out = torch.empty(N)
    torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", group, out)
    c.equal(out, total, "one_shot_all_reduce_out")
    view = t[100:400]  # a view at an offset: every rank reads its peers there
    c.equal(torch.ops.symm_mem.one_shot_all_reduce(view, "sum", group), total[100:400], "one_shot on a view")
    local = _expected(r, 300, torch.float32, salt=3).view(20, 15)
    c.equal(torch.ops.symm_mem.one_shot_all_reduce_copy(t, local, "sum", group),
            sum(_expected(p, 300, torch.float64, salt=3) for p in range(ws)).to(torch.float32).view(20, 15),
            "one_shot_all_reduce_copy")
    _fill(t, r)
    torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group)
    c.equal(t, total, "two_shot_all_reduce_")
    _fill(t, r)
    out2 = torch.empty(N)
    torch.ops.symm_mem.two_shot_all_reduce_out(t, "sum", group, out2)
    c.equal(out2, total, "two_shot_all_reduce_out")
    # Bit for bit against dist.all_reduce on random data (the same reduction order).
    gen = torch.Generator().manual_seed(1234 + r)
    data = torch.randn(N, generator=gen)
    t.copy_(data)
    one = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group)
    ref = data.clone()
    dist.all_reduce(ref)
    c.equal(one.view(torch.int32), ref.view(torch.int32), "one_shot_all_reduce against dist.all_reduce, bitwise")
    c.digest("one_shot random", one)
    # reduce_scatter_out: along dim 0 and along the last dimension.
    rows = symm_mem.empty((ws * 4, 6), dtype=torch.float32, device="cpu")
    _fill(rows, r)
    full = sum(_expected(p, ws * 24, torch.float64) for p in range(ws)).to(torch.float32).view(ws * 4, 6)
    rs = torch.empty(4, 6)
    torch.ops.symm_mem.reduce_scatter_out(rows, group, False, rs)
    c.equal(rs, full[r * 4:(r + 1) * 4], "reduce_scatter_out along dim 0")
    cols = symm_mem.empty((5, ws * 3), dtype=torch.float32, device="cpu")
    _fill(cols, r)
    full_c = sum(_expected(p, ws * 15, torch.float64) for p in range(ws)).to(torch.float32).view(5, ws * 3)
    rc = torch.empty(5, 3)
    torch.ops.symm_mem.reduce_scatter_out(cols, group, True, rc)
    c.equal(rc, full_c[:, r * 3:(r + 1) * 3], "reduce_scatter_out along the last dimension")
    # Signal words.
    words = torch.zeros(16, dtype=torch.int32)
    torch.ops.symm_mem.memset32_(words, 3, 7, 5)
    torch.ops.symm_mem.stream_write_value32_(words, 12, 9)
    c.equal(words, torch.tensor([0, 0, 0, 7, 7, 7, 7, 7, 0, 0, 0, 0, 9, 0, 0, 0], dtype=torch.int32), "memset32_")
    # Refusals, each before any communication.
    for call, expect in [
        (lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "max", group), "only 'sum'"),
        (lambda: torch.ops.symm_mem.multimem_all_reduce_(t, "sum", group), "no multicast"),
        (lambda: torch.ops.symm_mem.multimem_all_gather_out(t, group, t), "no multicast"),
    ]:
        try:
            call()
            c.fail(f"expected an error containing {expect!r}")
        except RuntimeError as exc:
            c.true(expect in str(exc), str(exc))


def check_windows(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    c10d = dist.distributed_c10d
    c.true(c10d._supports_window(), "_supports_window() is False on a one-host tuned group")
    buf = symm_mem.empty(N, dtype=torch.float32, device="cpu")
    buf.zero_()
    win = c10d._new_window(buf)
    dist.barrier()  # every window zeroed and registered before anybody puts
    # put: our block of 10 elements, at offset 10 * r of the next rank's window.
    win.put(_expected(r, 10, torch.float32), nxt, 10 * r, False).wait()
    win.signal(nxt, False)
    win.wait_signal(prv, False)
    c.equal(buf[10 * prv:10 * prv + 10], _expected(prv, 10, torch.float32), f"rank {prv}'s put")
    remote = win.map_remote_tensor(nxt)
    c.true(remote.shape == buf.shape and remote.dtype == buf.dtype, f"map_remote_tensor shape {remote.shape}")
    c.equal(remote[10 * r:10 * r + 10], _expected(r, 10, torch.float32), "our put seen through map_remote_tensor")
    attr = win.get_attr(nxt)
    c.true(str(attr.access_type).endswith("UNIFIED"), f"get_attr: {attr.access_type}")
    # Signals count: two signals satisfy two waits.
    win.signal(nxt, True)
    win.signal(nxt, True)
    win.wait_signal(prv, True)
    win.wait_signal(prv, True)
    try:
        win.put(torch.ones(5), nxt, N - 2, False)
        c.fail("a put past the window did not raise")
    except RuntimeError as exc:
        c.true("outside rank" in str(exc), str(exc))
    dist.barrier()
    # A window on a view at an offset, registered after creation, then deregistered.
    view = buf.narrow(0, 200, 64)
    win2 = c10d._new_window()
    win2.tensor_register(view)
    win2.put(torch.full((4,), float(r + 1)), nxt, 8, False)
    win2.signal(nxt, False)
    win2.wait_signal(prv, False)
    c.equal(buf[208:212], torch.full((4,), float(prv + 1)), "put into a window over a view at an offset")
    c.equal(win2.map_remote_tensor(nxt)[8:12], torch.full((4,), float(r + 1)), "map_remote_tensor of a view")
    win2.tensor_deregister()
    try:
        win2.put(torch.ones(1), nxt, 0, False)
        c.fail("put after tensor_deregister did not raise")
    except RuntimeError as exc:
        c.true("no tensor is registered" in str(exc), str(exc))
    dist.barrier()


def check_subgroup(c: Checker) -> None:
    r, ws = c.rank, c.world_size
    members = [0, ws - 1]
    sub = dist.new_group(members, backend="tuned")
    if r not in members:
        return
    name = sub.group_name
    t = _SymmetricMemory.empty_strided_p2p((64,), (1,), torch.float32, torch.device("cpu"), name)
    c.true(tunedist.is_symmetric(t, group=sub), "empty_strided_p2p(group_name=sub) is not in the sub-group's heap")
    hdl = symm_mem.rendezvous(t, sub)
    me = members.index(r)
    c.true(hdl.rank == me and hdl.world_size == 2, f"sub-group rank {hdl.rank} of {hdl.world_size}")
    _fill(t, r)
    hdl.barrier()
    for i, p in enumerate(members):
        c.equal(hdl.get_buffer(i, (64,), torch.float32), _expected(p, 64, torch.float32), f"sub-group get_buffer({i})")
    hdl.barrier()


SECTIONS = {
    "allocator": check_allocator,
    "rendezvous": check_rendezvous,
    "views_offsets": check_views_offsets,
    "signals": check_signals,
    "interop": check_interop,
    "operators": check_operators,
    "windows": check_windows,
    "subgroup": check_subgroup,
}
