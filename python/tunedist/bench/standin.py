"""The all_reduce bound as this machine executes it: the design that the peers-only bound 4(P-1)/(3P+1) x memcpy
describes (each rank copies in only what its peers need and reduces in place), run with plain kernels on shared
memory beside the collectives, with nothing of tunedist's engine but its copy kernel. It belongs to the benchmark
package, not to benchmarks/: `python -m tunedist.bench` runs it in every round of its bound point, so it must be
installed with the command a user runs, and benchmarks/ is not installed.

Why: the memcpy probe copies within one core, and a collective moves bytes between cores. Where two ranks' CPUs
share a core's caches the collective moves them faster than the probe allows for (busbw over the formula above 1);
where they sit far apart (another core complex, another socket) the bytes a rank reads from a peer cross that
distance, which the probe never pays. This stand-in pays exactly what the design pays, on the CPUs the job landed
on, so a collective's time over it says how far the collective is from what the design can reach there.

One call on rank p of P, N elements, its input X (private memory) cut into P parts, S_p and T_p its shared regions:
  1. for every peer q: S_p[part q] <- X[part q]            (what q needs of ours)
  2. barrier
  3. X[part p] += S_q[part p] for every peer q, in rank order (our part reduced in place)
  4. T_p <- X[part p]                                      (the reduced part, for the peers)
  5. barrier
  6. for every peer q: X[part q] <- T_q                    (their reduced parts)
The next call's step 1 rewrites S_p only after barrier 5 (every peer finished step 3), its step 4 rewrites T_p only
after barrier 2 (every peer finished step 6). A barrier is a counter per rank in the shared regions (a plain store;
the copies before it end with an sfence or with cached stores, which x86 keeps in order; other machines get no
stand-in), polled with a yield between reads: microseconds against the milliseconds of a large call, and no
control-group message. Copies run either with torch's copy (cached stores) or with the engine's streaming copy
(tunedist._C.copy_gbps), and each measurement keeps the faster, as the floors of benchmarks/bench_ab_builds.py do.

The shared regions have no name in any file system: each rank makes an anonymous memfd (os.memfd_create) and its
peers open it through /proc/<pid>/fd/<fd>, which needs the ptrace read access that ranks of one user have over each
other. Nothing outlives the processes, whatever kills them. Before opening, the ranks check that they share one
machine (boot id) and pid namespace, so that a pid means the same process to all, and one TUNEDIST_HOST_ID (a job
that stands in for several hosts gets no stand-in); after opening, that the file is the region they were told of
(its memfd name carries a random token). Where any of this fails the stand-in is not measured and the bench says
why.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import statistics
import time

import torch
import torch.distributed as dist

import tunedist


class StandinUnavailable(RuntimeError):
    """The stand-in cannot run here. Raised on every rank at once, only after the ranks agreed on it (a collective),
    so that no rank goes on to the next collective while its peers wait in this one."""


class SharedRegions:
    """Each rank's shared-memory region of `nbytes` bytes, mapped by every rank of the default group: regions[q] is
    rank q's, as a uint8 tensor. Collective (every rank constructs it with the same `nbytes`). `local_error`: a reason
    this rank cannot take part, shared with the others through the first gather. Every failure raises
    StandinUnavailable on every rank."""

    def __init__(self, nbytes: int, local_error: str = ""):
        rank, world = dist.get_rank(), dist.get_world_size()
        self._maps: list[mmap.mmap] = []
        fd, mine, error = -1, None, local_error
        # The name makes sure that what a peer opens at /proc/<pid>/fd/<fd> is this region and nothing else.
        name = f"tunedist-standin-{secrets.token_hex(16)}"
        if not error:
            try:
                fd = os.memfd_create(name, os.MFD_CLOEXEC)
                os.ftruncate(fd, nbytes)
                mine = mmap.mmap(fd, nbytes)
            except OSError as e:
                if fd >= 0:
                    os.close(fd)
                fd, mine, error = -1, None, f"rank {rank}: {nbytes} B of memfd: {e}"
        where: list = [None] * world
        mapped: list = []
        try:
            dist.all_gather_object(where, (_machine(), os.getpid(), fd, name, error))
            failed = [w[4] for w in where if w[4]]
            if failed:
                raise StandinUnavailable("tunedist.bench stand-in: " + "; ".join(failed))
            if len({w[0] for w in where}) > 1:
                # A pid names a process only on its own machine and in its own pid namespace.
                raise StandinUnavailable("tunedist.bench stand-in: the ranks are not on one host (their boot ids, "
                                         "pid namespaces or TUNEDIST_HOST_ID differ); it measures shared memory "
                                         "between the ranks of one host")
            errors = []
            for q, (_, pid, qfd, qname, _) in enumerate(where):
                if q == rank:
                    mapped.append(mine)
                    continue
                try:
                    path = f"/proc/{pid}/fd/{qfd}"
                    peer = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                    try:
                        if os.readlink(f"/proc/self/fd/{peer}") != f"/memfd:{qname} (deleted)":
                            raise OSError(f"{path} is not rank {q}'s region")
                        mapped.append(mmap.mmap(peer, nbytes))
                    finally:
                        os.close(peer)
                except OSError as e:
                    errors.append(f"rank {rank} cannot map rank {q}'s region (pid {pid}): {e}")
            flags = [None] * world
            dist.all_gather_object(flags, "; ".join(errors))
            refused = [f for f in flags if f]
            if refused:
                raise StandinUnavailable("tunedist.bench stand-in: " + "; ".join(refused) + " (the ranks must run "
                                         "as one user with ptrace read access to each other)")
        except BaseException:
            for m in mapped:
                if m is not None:
                    m.close()
            raise
        finally:
            if fd >= 0:
                os.close(fd)  # the mapping keeps the memory; peers opened it before the gather above
        self._maps = mapped
        self.regions = [torch.frombuffer(m, dtype=torch.uint8) for m in self._maps]

    def close(self) -> None:
        """Unmaps what no tensor still uses (a mapping with live tensors goes with the last of them)."""
        self.regions = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass
        self._maps = []


def _machine() -> tuple:
    """This machine's boot, this process's pid namespace and the host it stands for (TUNEDIST_HOST_ID, as tuned
    groups read it): equal on two ranks exactly when a pid means the same process to both and the job treats them
    as one host."""
    host = os.environ.get("TUNEDIST_HOST_ID", "")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip(), os.stat("/proc/self/ns/pid").st_ino, host
    except OSError:
        return "unknown", 0, host  # no /proc: opening a peer's region fails below, with its error


def _copiers() -> dict:
    engine = tunedist._C.copy_gbps
    return {"torch copy": lambda dst, src: dst.copy_(src),
            "streaming copy": lambda dst, src: engine(dst, src) if dst.numel() else None}


# Bytes before a region's data: its barrier counter (int64), alone in its cache line.
HEADER_BYTES = 64
# A barrier that waits this long names the ranks it waits for and fails (a peer died or stopped calling).
BARRIER_TIMEOUT_S = 120.0
# The barrier's plain store and loads order the copies around them only where stores are not reordered with other
# stores nor loads with other loads (x86's TSO; the streaming copy ends with an sfence).
ORDERED_MACHINES = ("x86_64", "amd64", "i386", "i686")
# check() fills and compares this many elements at a time, so its temporaries stay small at any size.
CHECK_CHUNK = 1 << 20
# The check's values repeat with a prime period under the largest integer the dtype holds exactly (bf16 256,
# float16 2048), so that a part moved by anything but a multiple of it shows.
PERIODS = {torch.bfloat16: 251, torch.float16: 2039}
DEFAULT_PERIOD = 65521


class AllreduceStandin:
    """The design above for `count` elements of `dtype` on every rank of the default group (collective). Raises
    StandinUnavailable on every rank where it cannot run."""

    def __init__(self, count: int, dtype: torch.dtype):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dtype = dtype
        itemsize = torch.empty(0, dtype=dtype).element_size()
        error = ""
        if platform.machine().lower() not in ORDERED_MACHINES:
            error = f"rank {self.rank}: its barrier relies on x86's store order, and this is {platform.machine()}"
        self.x = None
        if not error:
            try:
                self.x = torch.zeros(count, dtype=dtype)
            except RuntimeError as e:  # out of memory: said through the first gather, so every rank stops there
                error = f"rank {self.rank}: its input of {count} elements: {e}"
        base, extra = divmod(count, self.world)
        sizes = [base + (q < extra) for q in range(self.world)]
        self.bounds = [(sum(sizes[:q]), sizes[q]) for q in range(self.world)]
        biggest = max(sizes)
        # Each region: header, S (count elements), T (the largest part); S and T start on 64-byte boundaries.
        t_offset = HEADER_BYTES + -(-count * itemsize // 64) * 64
        self._shared = SharedRegions(t_offset + biggest * itemsize, error)
        regions = self._shared.regions
        self.flags = [r[:8].view(torch.int64) for r in regions]
        self.s = [r[HEADER_BYTES:HEADER_BYTES + count * itemsize].view(dtype) for r in regions]
        self.t = [r[t_offset:t_offset + biggest * itemsize].view(dtype) for r in regions]
        self._arrivals = 0

    def close(self) -> None:
        self.s, self.t, self.flags = [], [], []
        self._shared.close()

    def barrier(self) -> None:
        self._arrivals += 1
        self.flags[self.rank][0] = self._arrivals
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        for q in range(self.world):
            while int(self.flags[q][0]) < self._arrivals:
                if time.monotonic() > deadline:
                    late = [r for r in range(self.world) if int(self.flags[r][0]) < self._arrivals]
                    raise RuntimeError(f"tunedist.bench stand-in: rank {self.rank} waited {BARRIER_TIMEOUT_S:.0f} s "
                                       f"at barrier {self._arrivals} for ranks {late}")
                os.sched_yield()

    def _part(self, buf, q: int):
        start, n = self.bounds[q]
        return buf.narrow(0, start, n)

    def call(self, copy) -> None:
        p = self.rank
        for q in range(self.world):
            if q != p:
                copy(self._part(self.s[p], q), self._part(self.x, q))  # 1.
        self.barrier()  # 2.
        mine = self._part(self.x, p)
        for q in range(self.world):
            if q != p:
                mine.add_(self._part(self.s[q], p))  # 3.
        n = self.bounds[p][1]
        copy(self.t[p][:n], mine)  # 4.
        self.barrier()  # 5.
        for q in range(self.world):
            if q != p:
                copy(self._part(self.x, q), self.t[q][:self.bounds[q][1]])  # 6.

    def _expected(self, start: int, end: int):
        """Elements [start, end) of the result: (i % period) + 1, exact in the dtype."""
        period = PERIODS.get(self.dtype, DEFAULT_PERIOD)
        i = torch.arange(start, end, dtype=torch.int64)
        return i, (i % period + 1).to(self.dtype)

    def check(self) -> int:
        """One call per copier; returns the elements that came out wrong, summed over ranks. Element i comes from rank
        i % P alone (the others hold 0 there), so every part of P or more elements holds every rank's data, the sum
        is exact in every dtype at any world size, and a part that lands in the wrong place, or not at all, shows
        (unless moved by a multiple of the values' period, PERIODS)."""
        wrong = 0
        n = self.x.numel()
        for copy in _copiers().values():
            for start in range(0, n, CHECK_CHUNK):
                i, want = self._expected(start, min(n, start + CHECK_CHUNK))
                self.x[start:start + len(i)] = torch.where(i % self.world == self.rank, want, torch.zeros_like(want))
            self.call(copy)
            for start in range(0, n, CHECK_CHUNK):
                _, want = self._expected(start, min(n, start + CHECK_CHUNK))
                wrong += int((self.x[start:start + len(want)] != want).sum())
        self.x.zero_()  # timed calls sum zeros: the values never grow
        t = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t.item())

    def time_us(self, reps: int = 3, over_ranks=None) -> dict:
        """Per copier, the median µs of `reps` calls (a barrier before each), combined over ranks by `over_ranks`
        (a function of this rank's list of values that returns the group's; default: the mean); "best": the faster
        copier's."""
        copiers = _copiers()
        medians = []
        for copy in copiers.values():
            runs = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                self.call(copy)
                runs.append(time.perf_counter() - t0)
            medians.append(statistics.median(runs) * 1e6)
        if over_ranks is None:
            t = torch.tensor(medians, dtype=torch.float64)
            dist.all_reduce(t)
            combined = (t / self.world).tolist()
        else:
            combined = over_ranks(medians)
        out = dict(zip(copiers, combined))
        out["best"] = min(combined)
        return out
