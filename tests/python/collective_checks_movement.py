"""The collective checks of test_collectives.py, part 2: data movement (all_gather and its forms, gather/scatter,
all_to_all), barrier and object collectives, functional collectives, zero-size, non-contiguous and async calls,
and sub-groups."""

from __future__ import annotations

import itertools
import warnings

import torch
import torch.distributed as dist

from collective_checks import SIZES, Checker
from dist_utils import make_input, reference


def check_all_gather(c: Checker) -> None:
    w = c.world_size
    for dtype in (torch.float32, torch.float16, torch.int64, torch.bool):
        for n in SIZES:
            outs = [torch.empty(n, dtype=dtype) for _ in range(w)]
            dist.all_gather(outs, make_input(dtype, n, c.rank, "ag"))
            for p in range(w):
                c.equal(outs[p], make_input(dtype, n, p, "ag"), f"all_gather {dtype} n={n} block {p}")


def check_all_gather_into_tensor(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
        for n in SIZES:
            expected = torch.cat([make_input(dtype, n, p, "agt") for p in range(w)])
            mine = make_input(dtype, n, rank, "agt")
            out = torch.empty(w * n, dtype=dtype)
            dist.all_gather_into_tensor(out, mine)
            c.equal(out, expected, f"all_gather_into_tensor {dtype} n={n}")
            # Stacked output shape (w, n).
            out2 = torch.empty(w, n, dtype=dtype)
            dist.all_gather_into_tensor(out2, mine)
            c.equal(out2, expected.view(w, n), f"all_gather_into_tensor stacked {dtype} n={n}")
            # In place: the input is our own block of the output (FSDP2).
            out3 = torch.zeros(w * n, dtype=dtype)
            block = out3.chunk(w)[rank] if n > 0 else out3.view(w, n)[rank]
            block.copy_(mine)
            dist.all_gather_into_tensor(out3, block)
            c.equal(out3, expected, f"all_gather_into_tensor in-place {dtype} n={n}")
    # uint8 views of float tensors (how FSDP flattens mixed dtypes).
    for n in (0, 1, 1001, 300_001):
        mine = make_input(torch.float32, n, rank, "agu8")
        out = torch.empty(w * n * 4, dtype=torch.uint8)
        dist.all_gather_into_tensor(out, mine.view(torch.uint8))
        expected = torch.cat([make_input(torch.float32, n, p, "agu8") for p in range(w)])
        c.equal(out.view(torch.float32), expected, f"all_gather_into_tensor uint8 view of float32 n={n}")


def check_all_gather_coalesced(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    specs = [(torch.float32, 1001), (torch.bfloat16, 0), (torch.int64, 300_001), (torch.uint8, 17)]
    outs = [torch.empty(w * n, dtype=dt) for dt, n in specs]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for (dt, n), out in zip(specs, outs):
            dist.all_gather_into_tensor(out, make_input(dt, n, rank, "agc"))
    cm.wait()
    for (dt, n), out in zip(specs, outs):
        expected = torch.cat([make_input(dt, n, p, "agc") for p in range(w)])
        c.equal(out, expected, f"coalesced all_gather_into_tensor {dt} n={n}")


def check_gather_scatter(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for root in range(w):
        for dtype in (torch.float32, torch.int64):
            for n in SIZES:
                outs = [torch.empty(n, dtype=dtype) for _ in range(w)] if rank == root else None
                dist.gather(make_input(dtype, n, rank, "ga"), outs, dst=root)
                if rank == root:
                    for p in range(w):
                        c.equal(outs[p], make_input(dtype, n, p, "ga"), f"gather root={root} {dtype} n={n} "
                                f"block {p}")
                ins = [make_input(dtype, n, p, f"sc{root}") for p in range(w)] if rank == root else None
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, ins, src=root)
                c.equal(out, make_input(dtype, n, rank, f"sc{root}"), f"scatter root={root} {dtype} n={n}")


def _a2a_rows(src: int, dst: int, big: bool) -> int:
    """Rows rank src sends to rank dst; some pairs send nothing."""
    if (src + 2 * dst) % 3 == 0:
        return 0
    return (60_000 if big else 5) + 7 * src + 3 * dst


def check_all_to_all(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype in (torch.float32, torch.int16, torch.bool):
        # Lists, with a different size per pair (some empty).
        ins = [make_input(dtype, _a2a_rows(rank, p, False), rank, f"a2a{p}") for p in range(w)]
        outs = [torch.empty(_a2a_rows(p, rank, False), dtype=dtype) for p in range(w)]
        dist.all_to_all(outs, ins)
        for p in range(w):
            c.equal(outs[p], make_input(dtype, _a2a_rows(p, rank, False), p, f"a2a{rank}"),
                    f"all_to_all {dtype} block from {p}")


def check_all_to_all_single(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    cols = 4
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        # Even splits.
        for k in (0, 1, 50_000):
            inp = make_input(dtype, w * k * cols, rank, "a2as").view(w * k, cols)
            out = torch.empty_like(inp)
            dist.all_to_all_single(out, inp)
            expected = torch.cat([make_input(dtype, w * k * cols, p, "a2as").view(w * k, cols)[rank * k:(rank + 1) * k]
                                  for p in range(w)])
            c.equal(out, expected, f"all_to_all_single even {dtype} rows/peer={k}")
        # Uneven, with zero splits; big enough that some transfers exceed a slot.
        for big in (False, True):
            in_splits = [_a2a_rows(rank, p, big) for p in range(w)]
            out_splits = [_a2a_rows(p, rank, big) for p in range(w)]
            inputs = [make_input(dtype, sum(_a2a_rows(r, p, big) for p in range(w)) * cols, r, f"a2au{big}")
                      .view(-1, cols) for r in range(w)]
            out = torch.empty(sum(out_splits), cols, dtype=dtype)
            dist.all_to_all_single(out, inputs[rank], out_splits, in_splits)
            parts = []
            for p in range(w):
                start = sum(_a2a_rows(p, q, big) for q in range(rank))
                parts.append(inputs[p][start:start + _a2a_rows(p, rank, big)])
            c.equal(out, torch.cat(parts), f"all_to_all_single uneven {dtype} big={big} splits in={in_splits} "
                    f"out={out_splits}")
    # All splits zero.
    out = torch.empty(0, cols)
    dist.all_to_all_single(out, torch.empty(0, cols), [0] * w, [0] * w)


def check_barrier_and_objects(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for _ in range(3):
        dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait()
    objs = [None] * w
    dist.all_gather_object(objs, {"rank": rank, "payload": list(range(rank * 3)), "s": "x" * (rank * 1000)})
    for p in range(w):
        c.true(objs[p] == {"rank": p, "payload": list(range(p * 3)), "s": "x" * (p * 1000)},
               f"all_gather_object slot {p} holds {objs[p]!r:.80}")
    for root in range(w):
        lst = [("from", rank), {"big": list(range(5000))}, None] if rank == root else [None, None, None]
        dist.broadcast_object_list(lst, src=root)
        c.true(lst == [("from", root), {"big": list(range(5000))}, None],
               f"broadcast_object_list root={root} gave {lst!r:.80}")


def check_functional(c: Checker) -> None:
    import torch.distributed._functional_collectives as funcol

    w, rank = c.world_size, c.rank
    group = dist.group.WORLD
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's deprecation notice
    for n in (0, 1001, 300_001):
        inputs = [make_input(torch.float32, n, r, "fc") for r in range(w)]
        out = funcol.all_reduce(inputs[rank].clone(), "sum", group=group).wait()
        c.equal(out, reference("SUM", inputs), f"funcol.all_reduce n={n}")
        out = funcol.all_gather_tensor(inputs[rank], 0, group=group).wait()
        c.equal(out, torch.cat(inputs), f"funcol.all_gather_tensor n={n}")
        full = [make_input(torch.float32, w * n, r, "fcrs") for r in range(w)]
        out = funcol.reduce_scatter_tensor(full[rank], "sum", 0, group=group).wait()
        c.equal(out, reference("SUM", [f[rank * n:(rank + 1) * n] for f in full]),
                f"funcol.reduce_scatter_tensor n={n}")


def check_zero_size(c: Checker) -> None:
    """Every op with zero-element tensors, including 2-D empties; none may hang or fail."""
    w, rank = c.world_size, c.rank
    e = torch.empty(0, 3)
    dist.all_reduce(e)
    dist.all_reduce_coalesced([e, torch.empty(0)])
    dist.broadcast(e, src=w - 1)
    dist.reduce(e, dst=0)
    outs = [torch.empty(0, 3) for _ in range(w)]
    dist.all_gather(outs, e)
    dist.all_gather_into_tensor(torch.empty(0, 3), e)
    dist.gather(e, outs if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(0, 3), outs if rank == 0 else None, src=0)
    dist.reduce_scatter(torch.empty(0, 3), [torch.empty(0, 3) for _ in range(w)])
    dist.reduce_scatter_tensor(torch.empty(0, 3), torch.empty(0, 3))
    dist.all_to_all([torch.empty(0) for _ in range(w)], [torch.empty(0) for _ in range(w)])
    dist.all_to_all_single(torch.empty(0), torch.empty(0))
    for work in (dist.all_reduce(torch.empty(0), async_op=True), dist.broadcast(torch.empty(0), 0, async_op=True)):
        work.wait()
        c.true(work.is_completed(), "a zero-size async op is not completed after wait()")


def check_non_contiguous(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    for dtype in (torch.float32, torch.bfloat16):
        for rows, cols in ((3, 5), (400, 700)):
            # all_reduce of a transposed 2-D tensor.
            bases = [make_input(dtype, rows * cols, r, "nc").view(rows, cols) for r in range(w)]
            t = bases[rank].clone().t()
            dist.all_reduce(t)
            c.equal(t, reference("SUM", [b.t() for b in bases]), f"all_reduce transposed {dtype} {rows}x{cols}")
            # all_reduce of a strided slice; the elements in between must stay untouched.
            full = bases[rank].clone().view(-1)
            sl = full[::2]
            dist.all_reduce(sl, op=dist.ReduceOp.MAX)
            expect = bases[rank].clone().view(-1)
            expect[::2] = reference("MAX", [b.view(-1)[::2] for b in bases])
            c.equal(full, expect, f"all_reduce on x[::2] {dtype} n={rows * cols}")
            # broadcast into a transposed tensor.
            for root in range(w):
                t = make_input(dtype, rows * cols, rank, "ncb").view(rows, cols).t()
                dist.broadcast(t, src=root)
                c.equal(t, make_input(dtype, rows * cols, root, "ncb").view(rows, cols).t(),
                        f"broadcast transposed root={root} {dtype} {rows}x{cols}")
            # all_gather into transposed outputs from a transposed input.
            outs = [torch.empty(cols, rows, dtype=dtype).t() for _ in range(w)]
            dist.all_gather(outs, bases[rank].t().contiguous().t())
            for p in range(w):
                c.equal(outs[p], bases[p], f"all_gather into transposed outputs {dtype} {rows}x{cols} block {p}")
            outs = [torch.empty(rows, cols, dtype=dtype) for _ in range(w)]
            dist.all_gather(outs, bases[rank].t().contiguous().t())
            for p in range(w):
                c.equal(outs[p], bases[p], f"all_gather from a non-contiguous input {dtype} {rows}x{cols} block {p}")
            # all_gather_into_tensor into a transposed output, and into a slice of a larger buffer (a storage offset;
            # the bytes around it must stay untouched).
            gathered = torch.cat(bases)
            out = torch.empty(cols, w * rows, dtype=dtype).t()
            dist.all_gather_into_tensor(out, bases[rank])
            c.equal(out, gathered, f"all_gather_into_tensor into a transposed output {dtype} {rows}x{cols}")
            buf = torch.zeros(w * rows * cols + 10, dtype=dtype)
            dist.all_gather_into_tensor(buf[3:3 + w * rows * cols], bases[rank].t().contiguous().t())
            c.equal(buf[3:3 + w * rows * cols].view(w * rows, cols), gathered,
                    f"all_gather_into_tensor into an offset slice {dtype} {rows}x{cols}")
            c.true(bool((buf[:3] == 0).all()) and bool((buf[3 + w * rows * cols:] == 0).all()),
                   f"all_gather_into_tensor into an offset slice {dtype} {rows}x{cols} wrote outside it")
            # reduce_scatter_tensor from a transposed input and from an offset slice of a larger buffer.
            full = [torch.cat([make_input(dtype, rows * cols, r * w + q, "ncrs").view(rows, cols) for q in range(w)])
                    for r in range(w)]
            expected = reference("SUM", [f.chunk(w)[rank] for f in full])
            out = torch.empty(rows, cols, dtype=dtype)
            dist.reduce_scatter_tensor(out, full[rank].t().contiguous().t())
            c.equal(out, expected, f"reduce_scatter_tensor from a transposed input {dtype} {rows}x{cols}")
            buf = torch.zeros(w * rows * cols + 10, dtype=dtype)
            buf[5:5 + w * rows * cols].copy_(full[rank].view(-1))
            out = torch.empty(rows, cols, dtype=dtype)
            dist.reduce_scatter_tensor(out, buf[5:5 + w * rows * cols])
            c.equal(out, expected, f"reduce_scatter_tensor from an offset slice {dtype} {rows}x{cols}")


def check_async(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    inputs = [[make_input(torch.float32, n, r, f"as{i}") for r in range(w)] for i, n in enumerate(SIZES)]
    ts = [inp[rank].clone() for inp in inputs]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    bt = make_input(torch.int64, 1001, rank, "asb")
    works.append(dist.broadcast(bt, src=0, async_op=True))
    outs = [torch.empty(1001) for _ in range(w)]
    works.append(dist.all_gather(outs, make_input(torch.float32, 1001, rank, "asg"), async_op=True))
    for i, work in enumerate(works):
        work.wait()
        c.true(work.is_completed(), f"work {i} is not completed after wait()")
        c.true(work.exception() is None, f"work {i} completed with {work.exception()}")
    for i, (t, work) in enumerate(zip(ts, works)):
        c.equal(t, reference("SUM", inputs[i]), f"async all_reduce n={SIZES[i]}")
        res = work.get_future().wait()
        c.true(isinstance(res, list) and len(res) == 1 and res[0] is not None and res[0].data_ptr() == t.data_ptr(),
               f"async all_reduce n={SIZES[i]}: get_future().wait() gave {type(res)} instead of [the tensor]")
        if isinstance(res, list) and len(res) == 1:
            c.equal(res[0], t, f"async all_reduce n={SIZES[i]} future value")
    c.equal(bt, make_input(torch.int64, 1001, 0, "asb"), "async broadcast")
    for p in range(w):
        c.equal(outs[p], make_input(torch.float32, 1001, p, "asg"), f"async all_gather block {p}")


def check_groups(c: Checker) -> None:
    """new_group: every subset (contiguous or not, overlapping), twice: 2 x (2^w - 1) groups alive at once."""
    w, rank = c.world_size, c.rank
    subsets = [list(s) for k in range(1, w + 1) for s in itertools.combinations(range(w), k)]
    groups = [(s, dist.new_group(s)) for s in subsets * 2]
    for gi, (members, g) in enumerate(groups):
        if rank not in members:
            continue
        t = torch.full((257,), float(rank + 1 + gi))
        dist.all_reduce(t, group=g)
        expected = torch.full((257,), float(sum(m + 1 + gi for m in members)))
        c.equal(t, expected, f"all_reduce in group {gi} {members}")
        c.true(dist.get_world_size(g) == len(members) and dist.get_rank(g) == members.index(rank),
               f"group {members}: size {dist.get_world_size(g)}, rank {dist.get_rank(g)}")
        root = members[-1]  # a global rank
        b = torch.full((33,), float(rank))
        dist.broadcast(b, src=root, group=g)
        c.equal(b, torch.full((33,), float(root)), f"broadcast in group {members} from global rank {root}")
        outs = [torch.empty(5, dtype=torch.int64) for _ in members]
        dist.all_gather(outs, torch.full((5,), rank, dtype=torch.int64), group=g)
        c.equal(torch.stack(outs), torch.tensor(members).repeat_interleave(5).view(-1, 5),
                f"all_gather in group {members}")
    # The world group still works after all that.
    t = torch.ones(3)
    dist.all_reduce(t)
    c.equal(t, torch.full((3,), float(w)), "world all_reduce after the sub-groups")
    for _, g in groups:
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
