"""The checks of test_symmetric.py, part 3: the heap itself (free and reuse, its files in /dev/shm, its bound and
its settings), several groups with a heap each, and FSDP2 allocating its staging buffers from the heap."""

from __future__ import annotations

import gc
import os
import re
import stat

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import tunedist
from collective_checks import Checker
from dist_utils import SHM_DIR, make_input, patched_environ, reference
from symmetric_checks import expect_path, mapped_shm, shm_exists, sym, sym_copy

# Ours carry our pid; any rank's, its own.
HEAP_NAME = re.compile(rf"tunedist_{os.getuid()}_heap_{os.getpid()}_[0-9a-f]{{32}}")
ANY_HEAP_NAME = re.compile(rf"tunedist_{os.getuid()}_heap_[0-9]+_[0-9a-f]{{32}}")
MIN_BYTES_VAR = "TUNEDIST_SYMMETRIC_MIN_BYTES"


def stats(group=None) -> dict[str, int]:
    return tunedist.symmetric_heap_stats(group)


# ---------------------------------------------------------------------------------------------------------------
# Free and reuse


def check_free_reuse(c: Checker) -> None:
    g = dist.new_group(backend="tuned")  # a heap of its own, with fresh counters
    s0 = stats(g)
    c.true(s0["reserved_bytes"] == 0 and s0["chunks"] == 0 and s0["in_use_bytes"] == 0, f"a new heap: {s0}")
    t = sym(1000, group=g)
    s1 = stats(g)
    c.true(s1["chunk_creations"] == 1 and s1["chunks"] == 1 and s1["allocations"] == 1
           and s1["in_use_bytes"] >= 4000, f"after one allocation of 4000 bytes: {s1}")
    del t
    gc.collect()
    s2 = stats(g)
    c.true(s2["in_use_bytes"] == s0["in_use_bytes"] and s2["reserved_bytes"] == s1["reserved_bytes"],
           f"after freeing it: {s2}")
    t = sym(1000, group=g)
    s3 = stats(g)
    c.true(s3["chunk_creations"] == 1 and s3["allocations"] == 2 and s3["in_use_bytes"] == s1["in_use_bytes"],
           f"after allocating the same size again: {s3}")
    del t
    # Many cycles of mixed sizes, freed in varying orders, stay within the first chunk.
    sizes = [1, 7, 1000, 65_536, 250_001, 3, 1_000_003]
    for cycle in range(60):
        ts = [tunedist.symmetric_empty(sizes[(i + cycle) % len(sizes)], group=g) for i in range(len(sizes))]
        for t in ts:
            t[-1] = cycle
        for i in (range(0, len(ts), 2) if cycle % 2 else range(len(ts) - 1, -1, -1)):
            ts[i] = None  # freed at once: tensors hold no reference cycles
        del ts, t
    s4 = stats(g)
    c.true(s4["reserved_bytes"] == s1["reserved_bytes"] and s4["chunks"] == 1 and s4["chunk_creations"] == 1
           and s4["in_use_bytes"] == 0 and s4["allocations"] == 2 + 60 * len(sizes)
           and s1["in_use_bytes"] <= s4["peak_in_use_bytes"] <= s4["reserved_bytes"],
           f"after 60 cycles of {len(sizes)} allocations: {s4}")
    # A view keeps its memory.
    t = sym(1000, group=g)
    v = t[10:20]
    del t
    gc.collect()
    c.true(stats(g)["in_use_bytes"] == s1["in_use_bytes"], "a view's memory was freed while the view lives")
    del v
    gc.collect()
    c.true(stats(g)["in_use_bytes"] == 0, f"memory not freed with its last view: {stats(g)}")
    # The heap still works after all that.
    w = c.world_size
    inputs = [make_input(torch.float32, 65_536, r, "fr") for r in range(w)]
    t = sym_copy(inputs[c.rank], group=g)
    with expect_path(c, "all_reduce after 60 alloc/free cycles", zero_copy=1, group=g):
        dist.all_reduce(t, group=g)
    c.equal(t, reference("SUM", inputs), "all_reduce after 60 alloc/free cycles")
    del t
    dist.destroy_process_group(g)
    _check_outlives_group(c, run_collective=False)
    _check_outlives_group(c, run_collective=True)


def _check_outlives_group(c: Checker, run_collective: bool) -> None:
    """A symmetric tensor outlives its group: it stays usable, and its chunk's name is gone once the group is."""
    what = "a group destroyed " + ("after a collective" if run_collective else "before any collective")
    g = dist.new_group(backend="tuned")
    before = mapped_shm()
    t = sym(4096, group=g)
    names = {n for n in mapped_shm() - before if HEAP_NAME.fullmatch(n)}
    c.true(len(names) == 1, f"{what}: the allocation mapped {sorted(names)}, expected one heap chunk")
    if run_collective:
        dist.all_reduce(torch.ones(4), group=g)  # an ordinary tensor: our chunk is not listed yet
    dist.destroy_process_group(g)
    del g
    gc.collect()
    t.fill_(2.0)
    c.true(float(t.sum()) == 8192.0, f"{what}: the tensor is not usable after its group ended")
    left = sorted(n for n in names if shm_exists(n))
    c.true(not left, f"{what} while one of its symmetric tensors lives: {left} still in /dev/shm")
    del t
    gc.collect()
    left = sorted(n for n in names if shm_exists(n))
    c.true(not left, f"{what}, and its tensor freed: {left} still in /dev/shm")


# ---------------------------------------------------------------------------------------------------------------
# Several groups


def check_groups(c: Checker) -> None:
    w, rank = c.world_size, c.rank
    ga, gb = dist.new_group(backend="tuned"), dist.new_group(backend="tuned")
    world_before = stats()
    n = 5_003
    inputs = [make_input(torch.float32, n, r, "grp") for r in range(w)]
    expected = reference("SUM", inputs)
    ta, tb = sym_copy(inputs[rank], group=ga), sym_copy(inputs[rank], group=gb)
    for name, t, g, want in (("A's tensor in A", ta, ga, True), ("A's tensor in B", ta, gb, False),
                             ("A's tensor in WORLD", ta, None, False), ("B's tensor in B", tb, gb, True),
                             ("B's tensor in A", tb, ga, False)):
        c.true(tunedist.is_symmetric(t, g) == want, f"is_symmetric({name}) is {not want}")
    for name, g in (("A", ga), ("B", gb)):
        s = stats(g)
        c.true(s["chunk_creations"] == 1 and s["allocations"] == 1, f"group {name}'s heap: {s}")
    c.true(stats()["allocations"] == world_before["allocations"], "allocations in A and B counted in WORLD's heap")
    with expect_path(c, "A's tensor in A (A's heap)", zero_copy=1, group=ga), \
            expect_path(c, "A's tensor in A (B's heap)", zero_copy=0, group=gb):
        dist.all_reduce(ta, group=ga)
    c.equal(ta, expected, "all_reduce of A's tensor in A")
    ta.copy_(inputs[rank])
    with expect_path(c, "A's tensor in B", zero_copy=0, group=gb), \
            expect_path(c, "A's tensor in B (A's heap)", zero_copy=0, group=ga):
        dist.all_reduce(ta, group=gb)
    c.equal(ta, expected, "all_reduce of A's tensor in B (not symmetric for B: copying path)")
    ta.copy_(inputs[rank])
    mixed = tb if rank == 0 else ta
    with expect_path(c, "B's tensor on rank 0, A's elsewhere, in B", zero_copy=0, restarts=1, group=gb):
        dist.all_reduce(mixed, group=gb)
    c.equal(mixed, expected, "all_reduce in B of B's tensor on rank 0 and A's elsewhere")
    # Both groups' operations in flight at once, each on its own heap's buffers.
    full = [make_input(torch.float32, w * n, r, "grp_rs") for r in range(w)]
    blocks = [make_input(torch.bfloat16, n, r, "grp_ag") for r in range(w)]
    inp_b, out_a = sym_copy(full[rank], group=gb), sym(w * n, torch.bfloat16, group=ga)
    out_a.view(w, n)[rank].copy_(blocks[rank])
    out_b = sym(n, group=gb)
    with expect_path(c, "async ops in A and B", zero_copy=1, group=ga), \
            expect_path(c, "async ops in A and B", zero_copy=1, group=gb):
        works = [dist.reduce_scatter_tensor(out_b, inp_b, group=gb, async_op=True),
                 dist.all_gather_into_tensor(out_a, out_a.view(w, n)[rank], group=ga, async_op=True)]
        for work in works:
            work.wait()
    c.equal(out_b, reference("SUM", [f[rank * n:(rank + 1) * n] for f in full]), "reduce_scatter_tensor in B")
    c.equal(out_a, torch.cat(blocks), "all_gather_into_tensor in A")
    if w >= 3:
        _check_subgroup(c)
    _check_measured_default(c)
    del ta, tb, mixed, inp_b, out_a, out_b
    dist.destroy_process_group(ga)
    dist.destroy_process_group(gb)


def _check_subgroup(c: Checker) -> None:
    """Ranks 1..w-1: group ranks differ from global ones."""
    w, rank = c.world_size, c.rank
    members = list(range(1, w))
    g = dist.new_group(members, backend="tuned")
    if rank not in members:
        return
    inputs = {r: make_input(torch.float64, 777, r, "sub") for r in members}
    t = sym_copy(inputs[rank], group=g)
    with expect_path(c, f"all_reduce in group {members}", zero_copy=1, group=g):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
    c.equal(t, reference("MAX", [inputs[r] for r in members]), f"all_reduce MAX in group {members}")
    t.copy_(inputs[rank])
    with expect_path(c, f"broadcast in group {members}", zero_copy=1, group=g):
        dist.broadcast(t, src=w - 1, group=g)  # a global rank
    c.equal(t, inputs[w - 1], f"broadcast from global rank {w - 1} in group {members}")
    del t
    dist.destroy_process_group(g)


def _check_measured_default(c: Checker) -> None:
    """Without TUNEDIST_SYMMETRIC_MIN_BYTES, collectives on symmetric buffers from 64 KiB run the path the group
    measured faster for their op and size class (shm/zero_copy/path_chooser.h), the same on every rank; smaller ones
    copy. TUNEDIST_TEST_SLOW_PATHS makes the named paths report a second more per operation: with the copying and
    the streaming path slow, all_reduce of 256 KiB ends on zero-copy with cached stores; with both zero-copy paths
    slow, on the copying path. Every result is checked, through the probe window too."""
    w, rank = c.world_size, c.rank
    n = 65536  # 256 KiB of float32
    inputs = [make_input(torch.float32, n, r, "measured") for r in range(w)]
    expected = reference("SUM", inputs)
    for slow, want in (("copy,streaming", "zero-copy cached"), ("cached,streaming", "copy")):
        with patched_environ({MIN_BYTES_VAR: None, "TUNEDIST_TEST_SLOW_PATHS": slow}):
            g = dist.new_group(backend="tuned")
            s = tunedist.symmetric_heap_stats(g)
            c.true(s["min_bytes"] == 64 << 10 and s["zero_copy_choice"] == "measured",
                   f"default zero-copy settings: min_bytes {s['min_bytes']}, {s['zero_copy_choice']}")
            small = sym_copy(inputs[rank][:(16 << 10) - 1], group=g)
            with expect_path(c, "all_reduce of 64 KiB - 4 B with the measured default", zero_copy=0, group=g):
                dist.all_reduce(small, group=g)
            c.equal(small, expected[:(16 << 10) - 1], "all_reduce under 64 KiB")
            t = sym(n, group=g)
            for i in range(30):  # the class's warm-up, one probe window of every path, its verdict
                t.copy_(inputs[rank])
                dist.all_reduce(t, group=g)
                c.equal(t, expected, f"all_reduce {i} of 256 KiB, slow paths {slow}")
            t.copy_(inputs[rank])
            with expect_path(c, f"all_reduce after the verdict, slow paths {slow}", zero_copy=int(want != "copy"),
                             group=g):
                dist.all_reduce(t, group=g)
            c.equal(t, expected, f"all_reduce after the verdict, slow paths {slow}")
            paths = [(p["op"], p["bytes_from"], p["path"]) for p in tunedist.symmetric_heap_stats(g)["paths"]]
            c.true(paths == [("all_reduce", 256 << 10, want)], f"slow paths {slow}: chosen {paths}, expected "
                   f"all_reduce from 256 KiB on {want}")
            everyone = [None] * w
            dist.all_gather_object(everyone, paths)
            c.true(all(p == paths for p in everyone), f"slow paths {slow}: the ranks chose {everyone}")
            del small, t
            dist.destroy_process_group(g)


# ---------------------------------------------------------------------------------------------------------------
# The heap's files in /dev/shm


def check_heap_files(c: Checker) -> None:
    """Chunks are private files (0600, our uid in the name) while they exist; the first zero-copy operation on a
    chunk's memory removes its name (every peer has mapped it by then)."""
    w = c.world_size
    g = dist.new_group(backend="tuned")
    before = mapped_shm()
    t = sym(300_000, group=g)  # the first chunk (64 MiB by default)
    first = mapped_shm() - before
    big = sym(65 << 20, torch.uint8, group=g)  # more than a chunk: a chunk of its own
    second = mapped_shm() - before - first
    c.true(len(first) == 1 and len(second) == 1, f"two allocations mapped {sorted(first)} and {sorted(second)}, "
           "expected one new heap chunk each")
    for name in sorted(first | second):
        c.true(HEAP_NAME.fullmatch(name) is not None, f"{name}: not tunedist_<uid>_heap_<pid>_<32 hex digits>")
        try:
            st = os.stat(SHM_DIR / name)
        except FileNotFoundError:
            c.fail(f"{name}: no longer in /dev/shm before any collective")
            continue
        c.true(stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(),
               f"{name}: mode {oct(stat.S_IMODE(st.st_mode))}, owner {st.st_uid}; expected 0o600 and {os.getuid()}")
    for chunk, buf, what in ((first, t, "the first chunk"), (second, big[:4096], "the second chunk")):
        buf.fill_(1)
        with expect_path(c, f"the first zero-copy all_reduce on {what}", zero_copy=1, group=g):
            dist.all_reduce(buf, group=g)
        c.true(bool((buf == w).all()), f"the first zero-copy all_reduce on {what}: wrong result")
        left = sorted(n for n in chunk if shm_exists(n))
        c.true(not left, f"after the first zero-copy operation on {what}: {left} still in /dev/shm")
    peers = {n for n in mapped_shm() - before - first - second if ANY_HEAP_NAME.fullmatch(n)}
    c.true(len(peers) == 2 * (w - 1), f"mapped {len(peers)} chunks of peers' heaps, expected {2 * (w - 1)}")
    del t, big, buf
    dist.destroy_process_group(g)


# ---------------------------------------------------------------------------------------------------------------
# Bounds and settings (world size 2)


def check_bounds(c: Checker) -> None:
    mib = 1 << 20
    with patched_environ({"TUNEDIST_SYMMETRIC_CHUNK_BYTES": str(4 * mib),
                          "TUNEDIST_SYMMETRIC_HEAP_BYTES": str(8 * mib)}):
        g = dist.new_group(backend="tuned")
    a, b = sym(mib, group=g), sym(mib, group=g)  # 4 MiB each: two chunks, the bound
    full = stats(g)
    c.true(full["reserved_bytes"] == 8 * mib and full["chunks"] == 2, f"8 MiB heap after two 4 MiB tensors: {full}")
    for n in (1, 3 * mib):
        try:
            sym(n, group=g)
            c.fail(f"symmetric_empty({n}) beyond an 8 MiB TUNEDIST_SYMMETRIC_HEAP_BYTES did not raise")
        except RuntimeError as e:
            c.true("TUNEDIST_SYMMETRIC_HEAP_BYTES" in str(e), f"symmetric_empty({n}) beyond the bound: {e}")
    after = stats(g)
    c.true(all(after[k] == full[k] for k in ("reserved_bytes", "in_use_bytes", "chunks", "chunk_creations")),
           f"a failed allocation changed the heap: {full} -> {after}")
    a.fill_(c.rank + 1.0)
    with expect_path(c, "all_reduce on a full heap", zero_copy=1, group=g):
        dist.all_reduce(a, group=g)
    c.true(bool((a == sum(r + 1.0 for r in range(c.world_size))).all()), "all_reduce on a full heap: wrong result")
    del a
    gc.collect()
    a = sym(mib, group=g)  # fits again, in the freed block
    c.true(stats(g)["chunk_creations"] == 2, f"reallocating a freed 4 MiB block created a chunk: {stats(g)}")
    del a, b
    dist.destroy_process_group(g)
    _check_not_tuned(c)
    _check_bad_settings(c)


def _check_not_tuned(c: Checker) -> None:
    gg = dist.new_group(backend="gloo")
    calls = {"symmetric_empty": lambda: tunedist.symmetric_empty(4, group=gg),
             "is_symmetric": lambda: tunedist.is_symmetric(torch.ones(2), gg),
             "symmetric_heap_stats": lambda: tunedist.symmetric_heap_stats(gg)}
    for name, call in calls.items():
        try:
            call()
            c.fail(f"{name} on a gloo group did not raise")
        except ValueError as e:
            c.true("tuned" in str(e), f"{name} on a gloo group: {e}")
    dist.destroy_process_group(gg)


BAD_SETTINGS = {
    "chunk not a multiple of 4096": ({"TUNEDIST_SYMMETRIC_CHUNK_BYTES": "5000"}, "TUNEDIST_SYMMETRIC_CHUNK_BYTES"),
    "chunk 0": ({"TUNEDIST_SYMMETRIC_CHUNK_BYTES": "0"}, "TUNEDIST_SYMMETRIC_CHUNK_BYTES"),
    "bound below one chunk": ({"TUNEDIST_SYMMETRIC_CHUNK_BYTES": str(8 << 20),
                               "TUNEDIST_SYMMETRIC_HEAP_BYTES": str(4 << 20)}, "TUNEDIST_SYMMETRIC_HEAP_BYTES"),
    "bound not a number": ({"TUNEDIST_SYMMETRIC_HEAP_BYTES": "16G"}, "TUNEDIST_SYMMETRIC_HEAP_BYTES"),
    "threshold negative": ({MIN_BYTES_VAR: "-1"}, MIN_BYTES_VAR),
}


def _check_bad_settings(c: Checker) -> None:
    for case, (values, var) in BAD_SETTINGS.items():
        try:
            with patched_environ(values):
                dist.new_group(backend="tuned")
            c.fail(f"new_group(backend='tuned') with {values} ({case}) did not raise")
        except RuntimeError as e:
            c.true(var in str(e), f"new_group with {values} ({case}): the error does not name {var}: {e}")
    # Groups made afterwards work.
    g = dist.new_group(backend="tuned")
    t = sym(1000, group=g)
    t.fill_(1.0)
    dist.all_reduce(t, group=g)
    c.true(bool((t == c.world_size).all()), "all_reduce in a group created after the failed ones")
    del t
    dist.destroy_process_group(g)


# ---------------------------------------------------------------------------------------------------------------
# FSDP2 (world size 2): the same training with and without the process group's allocator.

FSDP_STEPS = 3


def _fsdp_train(rank: int, mesh, from_group: bool) -> dict:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if from_group:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    group = mesh.get_group()
    before = stats(group)
    losses = []
    for step in range(FSDP_STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 512, generator=gen), torch.randn(16, 512, generator=gen)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = stats(group)
    return {"losses": losses, "params": {k: p.to_local().detach().clone() for k, p in model.named_parameters()},
            **{k: after[k] - before[k] for k in ("zero_copy_ops", "copy_restarts", "allocations")}}


def check_fsdp2(c: Checker) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (c.world_size,))
    plain = _fsdp_train(c.rank, mesh, from_group=False)
    symmetric = _fsdp_train(c.rank, mesh, from_group=True)
    c.true(plain["losses"] == symmetric["losses"], f"losses {plain['losses']} (ordinary buffers) vs "
           f"{symmetric['losses']} (symmetric buffers)")
    for name, p in plain["params"].items():
        c.equal(symmetric["params"][name], p, f"parameter {name} after {FSDP_STEPS} steps, symmetric vs ordinary")
    c.true(plain["zero_copy_ops"] == 0 and plain["allocations"] == 0,
           f"FSDP2 without the group's allocator: {plain['zero_copy_ops']} zero-copy ops, "
           f"{plain['allocations']} symmetric allocations")
    c.true(symmetric["zero_copy_ops"] > 0 and symmetric["copy_restarts"] == 0 and symmetric["allocations"] > 0,
           f"FSDP2 with the group's allocator: {symmetric['zero_copy_ops']} zero-copy ops, "
           f"{symmetric['copy_restarts']} restarts, {symmetric['allocations']} symmetric allocations")
    print(f"rank {c.rank}: FSDP2 losses {symmetric['losses']}, {symmetric['zero_copy_ops']} zero-copy ops, "
          f"{symmetric['allocations']} symmetric allocations")
