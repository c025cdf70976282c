"""The contenders of `python -m tunedist.bench`: what it measures side by side, and how it calls each op on them.

- A c10d backend (tuned, gloo, ...) gets a group of its own and is called through torch.distributed.
- `tuned+sym` is a `tuned` group of its own whose benchmark buffers come from that group's symmetric heap
  (tunedist.symmetric_empty) instead of torch.empty, so its collectives can run zero-copy (tunedist.symmetric). Its
  heap counters (tunedist.symmetric_heap_stats) show whether they did: the bench reports each point's zero-copy calls
  next to the calls it made.
- `deepspeed` is not a c10d backend. It is DeepSpeed's CPU shared-memory all_reduce,
  `deepspeed.comm.inference_all_reduce`, after `deepspeed.init_distributed()` (which JIT-builds the shm op at first
  use, minutes, then caches it). It has all_reduce only, and takes no group: it reduces over the world, so the
  bench gives it the whole world. It needs DS_ACCELERATOR=cpu and LOCAL_SIZE = the ranks on this host (the shm
  path needs every rank there); DeepSpeed reads both when it is imported and initialised, so the bench sets them
  when unset, before the import.
- `tuned-op` is a `tuned` group of its own called through tunedist's operators (tunedist.all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor, broadcast: torch.ops.tunedist.*) instead of torch.distributed's
  Python layer (tunedist.ops), as DeepSpeed's API calls its kernel. `deepspeed-op` is that kernel,
  torch.ops.deepspeed.inference_all_reduce_, called directly (no Python wrapper): all_reduce only, over the world,
  and it sums whatever op it is given, so only its SUM points are right (the others are checked, found wrong and
  not timed).
- DeepSpeed's limitations, as benchmarks/probe_deepspeed.py measured them, are in DEEPSPEED_NOTES. The bench does not
  rely on them: it checks every point and times no deepspeed point whose check found wrong elements.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import tunedist

DEEPSPEED = "deepspeed"
DEEPSPEED_OP = "deepspeed-op"
TUNED_SYM = "tuned+sym"
TUNED_OP = "tuned-op"
# The contenders that are not c10d backend names.
OTHER_CONTENDERS = (DEEPSPEED, DEEPSPEED_OP, TUNED_SYM, TUNED_OP)
PROBED_VERSION = "0.19.8"
# What benchmarks/probe_deepspeed.py measured (docs/performance.md#all-reduce-against-deepspeed-and-gloo), printed
# when deepspeed runs.
DEEPSPEED_NOTES = (
    f"deepspeed is deepspeed.comm.inference_all_reduce: all_reduce only, over the world (it takes no group). "
    f"benchmarks/probe_deepspeed.py measured DeepSpeed {PROBED_VERSION} on an avx2 host (2 and 4 ranks):",
    "float32 SUM runs its shm kernel and is right; MAX and MIN come back as the SUM; a non-contiguous tensor comes "
    "back unchanged; a group is ignored (a 2-rank group of 4 ranks got the sum over all 4; a 1-rank group returns "
    "early, right);",
    "bf16, fp16, float64 and int32 are right there only because the API hands dtypes other than float32 to its kernel "
    "on avx512bw hosts alone and falls back to torch.distributed.all_reduce on the default group elsewhere; the "
    "kernel itself, called directly, returned float64 and int32 unchanged; on an avx512bw host (an Intel "
    "Xeon with AVX-512, 2 ranks) the API did the same: float64 and int32 unchanged, bf16/fp16 right.",
    "The path column says what ran (shm or fallback:<backend>); a deepspeed point with wrong elements is not timed.",
)


class C10dComm:
    """A c10d backend's group, called through torch.distributed."""

    def __init__(self, backend: str):
        self.group = dist.new_group(backend=backend)

    def empty(self, n: int, dtype) -> torch.Tensor:
        """A buffer the bench passes to the collectives (on the current device context)."""
        return torch.empty(n, dtype=dtype)

    def all_reduce(self, t, op):
        dist.all_reduce(t, op=op, group=self.group)

    def broadcast(self, t, src: int):
        dist.broadcast(t, src=src, group=self.group)

    def all_gather_into_tensor(self, out, inp):
        dist.all_gather_into_tensor(out, inp, group=self.group)

    def reduce_scatter_tensor(self, out, inp, op):
        dist.reduce_scatter_tensor(out, inp, op=op, group=self.group)

    def all_to_all_single(self, out, inp):
        dist.all_to_all_single(out, inp, group=self.group)

    def reduce(self, t, dst: int, op):
        dist.reduce(t, dst=dst, op=op, group=self.group)

    def gather(self, t, gather_list, dst: int):
        dist.gather(t, gather_list, dst=dst, group=self.group)

    def scatter(self, t, scatter_list, src: int):
        dist.scatter(t, scatter_list, src=src, group=self.group)

    def close(self):
        dist.destroy_process_group(self.group)


class SymmetricComm(C10dComm):
    """A `tuned` group whose benchmark buffers come from its symmetric heap: the zero-copy path where it applies."""

    def __init__(self):
        super().__init__("tuned")

    def empty(self, n: int, dtype) -> torch.Tensor:
        return tunedist.symmetric_empty(n, dtype=dtype, group=self.group)

    def heap_stats(self) -> dict:
        return tunedist.symmetric_heap_stats(self.group)

    def one_host(self) -> bool:
        """Whether the group is on one host: a group that spans hosts runs its hierarchical engine, never zero-copy."""
        return len(tunedist._C.host_layout(self.group._get_backend(torch.device("cpu")))) == 1


class DirectComm(C10dComm):
    """A `tuned` group of its own, called through tunedist's operators (tunedist.all_reduce, ...: no
    torch.distributed Python); the ops it lacks (all_to_all, reduce, gather, scatter) are skipped."""

    OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

    def __init__(self):
        super().__init__("tuned")

    def all_reduce(self, t, op):
        tunedist.all_reduce(t, op, self.group)

    def broadcast(self, t, src: int):
        tunedist.broadcast(t, src, self.group)

    def all_gather_into_tensor(self, out, inp):
        tunedist.all_gather_into_tensor(out, inp, self.group)

    def reduce_scatter_tensor(self, out, inp, op):
        tunedist.reduce_scatter_tensor(out, inp, op, self.group)


class DeepSpeedComm:
    """deepspeed.comm.inference_all_reduce on the world (it has no other op and takes no group)."""

    def __init__(self):
        self.dscomm, self.info = deepspeed_init()

    def empty(self, n: int, dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype)

    def all_reduce(self, t, op):
        self.dscomm.inference_all_reduce(t, op=op)

    def close(self):
        pass  # DeepSpeed has no teardown for its shm op; deepspeed_init already unlinked the segments


class DeepSpeedOpComm(DeepSpeedComm):
    """DeepSpeed's kernel, torch.ops.deepspeed.inference_all_reduce_, without its Python API around it: SUM over the
    world whatever `op` says (the checks catch the other ops)."""

    def __init__(self):
        super().__init__()
        if not self.info["shm_op"]:
            raise RuntimeError(f"{DEEPSPEED_OP}: DeepSpeed {self.info['version']} did not register "
                               f"torch.ops.deepspeed.inference_all_reduce_ (its shm op failed to build or load); "
                               f"see its build log above, or drop {DEEPSPEED_OP}")
        self.kernel = torch.ops.deepspeed.inference_all_reduce_

    def all_reduce(self, t, op):
        self.kernel(t)


@dataclass
class Contender:
    """One measured thing: its name, how it calls the ops it has, and how the bench treats its results."""

    name: str
    comm: object
    ops: tuple | None = None  # the ops it has (None: all); the others are skipped with a note
    time_wrong: bool = True  # time a point whose check found wrong elements (a backend's bug, as nccl-tests do)
    always_check: bool = False  # check every point even with -c 0
    notes: tuple = ()  # printed with the tables
    info: dict = field(default_factory=dict)

    def has(self, op: str) -> bool:
        return self.ops is None or op in self.ops

    @property
    def symmetric(self) -> bool:
        """Whether its buffers are symmetric, so that heap_stats() counts its zero-copy calls."""
        return isinstance(self.comm, SymmetricComm)

    def heap_stats(self) -> dict:
        return self.comm.heap_stats()

    def observe(self):
        """A context that yields what ran at a point (.path()): for deepspeed its kernel or its fallback."""
        if self.name == DEEPSPEED:
            return count_calls()
        return contextlib.nullcontext(Seen(fixed={DEEPSPEED_OP: "shm", TUNED_OP: "op"}.get(self.name, "c10d")))


def make(name: str) -> Contender:
    """The contender `name`: deepspeed, deepspeed-op, tuned+sym, tuned-op, or else a c10d backend (every rank, after
    init_process_group)."""
    if name == TUNED_OP:
        return Contender(name, DirectComm(), ops=DirectComm.OPS)
    if name == TUNED_SYM:
        comm = SymmetricComm()
        # The least buffer (S, as the bench defines it) that may run zero-copy, and whether it must
        # (TUNEDIST_SYMMETRIC_MIN_BYTES set) or the group measures each class.
        stats = comm.heap_stats()
        return Contender(name, comm, info={"min_bytes": stats["min_bytes"],
                                           "forced": stats["zero_copy_choice"] == "forced"})
    if name not in (DEEPSPEED, DEEPSPEED_OP):
        return Contender(name, C10dComm(name))
    comm = DeepSpeedComm() if name == DEEPSPEED else DeepSpeedOpComm()
    info = comm.info
    here = (f"This run: DeepSpeed {info['version']}, shm kernel level {info['kernel_level']} (2 avx512bw, 1 avx2)"
            f"{'' if info['version'] == PROBED_VERSION else '; not the version probed: rerun the probe'}.")
    return Contender(name, comm, ops=("all_reduce",), time_wrong=False, always_check=True,
                     notes=(*DEEPSPEED_NOTES, here), info=info)


@dataclass
class Seen:
    """What DeepSpeed's API called inside count_calls()."""

    kernel: int = 0  # calls of torch.ops.deepspeed.inference_all_reduce_ (DeepSpeed's shm kernel)
    c10d: int = 0  # calls of torch.distributed.all_reduce (DeepSpeed's fallback)
    fixed: str | None = None  # a c10d contender's path, not counted

    def path(self) -> str:
        if self.fixed:
            return self.fixed
        if self.kernel:
            return "shm"
        return f"fallback:{dist.get_backend()}" if self.c10d else "none"


def _counted(fn, seen: Seen, key: str):
    def call(*args, **kwargs):
        setattr(seen, key, getattr(seen, key) + 1)
        return fn(*args, **kwargs)
    return call


@contextlib.contextmanager
def count_calls():
    """Counts, inside the block, the calls DeepSpeed's API makes to its kernel and to torch.distributed.all_reduce:
    the path it took. Both are looked up by attribute at each call, so wrapping them there sees every call."""
    seen, c10d = Seen(), dist.all_reduce
    ns = torch.ops.deepspeed if _has_kernel() else None
    kernel = ns.inference_all_reduce_ if ns is not None else None
    dist.all_reduce = _counted(c10d, seen, "c10d")
    if ns is not None:
        ns.inference_all_reduce_ = _counted(kernel, seen, "kernel")
    try:
        yield seen
    finally:
        dist.all_reduce = c10d
        if ns is not None:
            ns.inference_all_reduce_ = kernel


def _has_kernel() -> bool:
    try:
        return hasattr(torch.ops.deepspeed, "inference_all_reduce_")
    except (AttributeError, RuntimeError):
        return False


def symmetric_problem(device: str) -> str | None:
    """What stands in the way of tuned+sym (None: nothing)."""
    if device != "cpu":
        return f"{TUNED_SYM} measures CPU buffers from tuned's symmetric heap: drop --device cuda"
    if "cpu" not in dist.Backend.backend_capability.get("tuned", []):
        return f"{TUNED_SYM} needs the tuned backend for cpu tensors, which is not registered"
    return None


def _env_int(name: str):
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def deepspeed_problem(device: str) -> str | None:
    """Sets DeepSpeed's environment where unset, imports it and says what stands in the way (None: nothing)."""
    if device != "cpu":
        return "deepspeed is DeepSpeed's CPU shared-memory all_reduce: drop --device cuda"
    world, local = _env_int("WORLD_SIZE"), _env_int("LOCAL_WORLD_SIZE")
    if world is not None and local is not None and world != local:
        return (f"deepspeed's shared-memory all_reduce needs every rank on one host (WORLD_SIZE {world}, "
                f"LOCAL_WORLD_SIZE {local}); measure it on one host")
    want = {"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(local) if local is not None else None}
    bad = {k: v for k, v in want.items() if v is not None and os.environ.get(k, v) != v}
    if bad:
        return (f"deepspeed here needs {' '.join(f'{k}={v}' for k, v in want.items() if v)} (set: "
                f"{' '.join(f'{k}={os.environ[k]}' for k in bad)}); unset them or set these")
    for k, v in want.items():
        if v is not None:
            os.environ.setdefault(k, v)  # read by DeepSpeed at import (DS_ACCELERATOR) and at init (LOCAL_SIZE)
    try:
        importlib.import_module("deepspeed")
    except ImportError as e:
        return (f"--backends deepspeed needs DeepSpeed, which is not importable ({e}): pip install deepspeed "
                f"(with a constraints file holding torch=={torch.__version__.split('+')[0]}, so pip keeps this "
                f"torch). It runs with DS_ACCELERATOR=cpu LOCAL_SIZE=<ranks on this host>, which the bench sets "
                f"when unset")
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415  (optional dependency)

    if get_accelerator().device_name() != "cpu":
        return (f"DeepSpeed picked accelerator {get_accelerator().device_name()!r} before the bench could set "
                f"DS_ACCELERATOR=cpu: run with DS_ACCELERATOR=cpu LOCAL_SIZE=<ranks on this host>")
    return None


def deepspeed_environment() -> None:
    """deepspeed_problem() for scripts: raises SystemExit with its message."""
    problem = deepspeed_problem("cpu")
    if problem:
        raise SystemExit(problem)


def _segment(rank: int) -> str:
    """The name of a rank's shm workspace, as DeepSpeed's shm.cpp spells it."""
    return (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")


@functools.cache
def deepspeed_init():
    """deepspeed.init_distributed() over the default group; returns (deepspeed.comm, facts). Every rank calls it,
    once per process (deepspeed and deepspeed-op share it).

    DeepSpeed never unlinks its shm workspaces (about 66 MiB per rank), so once every rank has mapped its peers'
    (deepspeed's init returns only then), each rank unlinks its own."""
    import deepspeed  # noqa: PLC0415  (optional dependency)
    import deepspeed.comm as dscomm  # noqa: PLC0415

    deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)
    cdb = dscomm.comm.cdb
    dist.barrier()
    own = _segment(dist.get_rank())
    unlinked = os.path.exists(own)
    if unlinked:
        os.unlink(own)
    info = {"version": deepspeed.__version__, "kernel_level": getattr(cdb, "shm_vector_kernel_level", None),
            "shm_op": _has_kernel(),
            "LOCAL_SIZE": os.environ.get("LOCAL_SIZE"), "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
            "segment_unlinked": unlinked}
    return dscomm, info
