"""Shared launch helper for the Python tests: run a function on N real processes of one host.

    from dist_utils import launch
    results = launch(4, _check_allreduce, torch.float32)   # [fn(0, 4, torch.float32), ..., fn(3, 4, ...)]

``fn`` must be a module-level function (it is pickled by reference into the children). Children are forked from a
torch.multiprocessing fork server that imported torch and tunedist once (see START_METHOD), and each starts with
exactly the environment a spawned child would have. Each child joins a process group over
``tcp://127.0.0.1:<free port>`` (unless ``init=False``), calls ``fn(rank, world_size, *args)``, always destroys the
group, and hands its return value back to the parent through a file (``torch.save``, so tensors are fine). The
parent raises :class:`LaunchError` with every failing rank's traceback, and kills all children when the overall
``timeout_s`` passes, so a hang never blocks the suite.

Also here: ``make_input``/``reference``/``mismatch``, deterministic inputs and bit-exact reference reductions
that the collective tests compute inside the ranks; ``expect_error`` (a call must raise) and ``assert_no_new_shm``
(a job left nothing in /dev/shm) for the fault tests.

Children also see ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, so an ``init=False``
function can call ``dist.init_process_group(..., init_method="env://")`` itself.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "tunedist_"

# How ranks start. A spawned child imports torch before it runs anything: ~3 s of CPU, paid by every rank of every
# launch, side by side on a 2-core machine. The fork server imports torch and tunedist once (PRELOAD) and forks each
# child from there; the child then takes the environment a spawned one would have had (the parent's os.environ at
# launch, plus the rank's variables and `env`) before it runs anything of the test, and reads TORCH_DISTRIBUTED_DEBUG
# again (torch.distributed reads it at import). A launch that sets a variable read only at import (IMPORT_TIME_ENV)
# spawns its ranks. TUNEDIST_TEST_START_METHOD=spawn spawns every launch's ranks.
START_METHOD = os.environ.get("TUNEDIST_TEST_START_METHOD", "forkserver")
IMPORT_TIME_ENV = ("TORCH_DISTRIBUTED_USE_TORCHCOMMS", "TUNEDIST_FLIGHT_RECORDER", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL")
PRELOAD = ["torch", "torch.distributed", "tunedist", "dist_utils"]

DEFAULT_TIMEOUT_S = 240.0
# How long a group's waits may last inside the backend before it reports a timeout. Well below the launch timeout,
# so a rank stuck on a dead or failed peer ends with the backend's own message rather than being killed.
DEFAULT_PG_TIMEOUT_S = 90.0
# Once one rank has failed, how long the others get to finish (or fail) before they are killed; longer when the
# caller expects failures (return_exceptions=True), since survivors must then detect the failure and return.
FAILURE_GRACE_S = 30.0
EXPECTED_FAILURE_GRACE_S = 90.0
# How long a rank that has reported its result gets to exit.
EXIT_GRACE_S = 30.0


class LaunchError(AssertionError):
    """One or more ranks failed, hung or crashed; the message holds every failing rank's story."""


@dataclass
class RankFailure:
    """What ``launch(..., return_exceptions=True)`` returns in place of a failed rank's value."""

    rank: int
    exitcode: int | None  # None: killed by the launcher (timeout)
    traceback: str | None  # None: the rank died without reporting (signal, os._exit, hang)
    reason: str

    def __str__(self) -> str:
        text = f"rank {self.rank}: {self.reason} (exit code {self.exitcode})"
        return text + ("\n" + self.traceback if self.traceback else "")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_entries() -> set[str]:
    """Names in /dev/shm that start with ``tunedist_`` (every segment this project creates)."""
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


# A segment's name exists from its creation until every rank has attached, which for a job starting next to ours
# (other suites on a loaded machine) can take seconds; a leak stays for good.
SHM_SETTLE_S = 15.0


def assert_no_new_shm(before: set[str]) -> None:
    """Fails if a ``tunedist_`` name that was not in `before` stays in /dev/shm longer than SHM_SETTLE_S."""
    leaked = shm_entries() - before
    deadline = time.monotonic() + SHM_SETTLE_S
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked &= shm_entries()
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"


def expect_error(fn, *args, expected=dist.DistBackendError, **kwargs) -> tuple[str, float]:
    """Calls fn; returns (message, seconds it took). Fails unless it raised `expected`: by default
    torch.distributed.DistBackendError, the type gloo and NCCL raise for a failed collective (a RuntimeError)."""
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
    except expected as exc:
        return str(exc), time.monotonic() - t0
    raise AssertionError(f"{getattr(fn, '__name__', fn)} returned instead of raising")


def meet_on_store(key: str, rank: int, world_size: int, timeout: timedelta | None = None) -> None:
    """Waits on the default group's store until every rank set `key`: after a refusal that failed the group, so no
    rank exits (rank 0 hosts the store under these launches) while a peer still reads the failure from it."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"{key}_{rank}", "1")
    keys = [f"{key}_{r}" for r in range(world_size)]
    if timeout is None:
        store.wait(keys)
    else:
        store.wait(keys, timeout)


def init_url(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


@contextlib.contextmanager
def patched_environ(env: dict[str, str | None] | None):
    """os.environ with ``env`` applied (a value of None removes the variable) inside the block: children started
    with ``spawn`` inherit os.environ as it is at start(), and tuned groups read their settings when created."""
    if not env:
        yield
        return
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write_result(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(payload, tmp)
    except Exception:  # noqa: BLE001 - the return value does not pickle: report that instead
        torch.save({"ok": False, "traceback": "return value could not be saved:\n" + traceback.format_exc()}, tmp)
    os.replace(tmp, path)


def _context(env: dict | None):
    """The torch.multiprocessing context a launch's ranks start from (see START_METHOD)."""
    method = "spawn" if any(k in (env or {}) for k in IMPORT_TIME_ENV) else START_METHOD
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
        # Started here, if it is not running yet, with the parent's environment as it is, not as patched for a rank.
        forkserver.ensure_running()
    return ctx


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, backend: str, init: bool,
            pg_timeout_s: float, result_dir: str, environ: dict[str, str]) -> None:
    result_path = Path(result_dir) / f"rank{rank}.pt"
    payload: dict[str, Any]
    try:
        # Exactly the environment a spawned child gets: a forked one inherited the fork server's.
        os.environ.clear()
        os.environ.update(environ)
        dist.set_debug_level_from_env()
        torch.set_num_threads(1)  # N ranks on a small machine: no intra-op thread oversubscription
        # The launcher sends SIGUSR1 before killing a straggler: every thread's Python stack goes to stderr.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        import tunedist  # noqa: F401  (registers the "tuned" backend)

        if init:
            dist.init_process_group(backend, init_method=init_url(port), rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=pg_timeout_s))
        value = fn(rank, world_size, *args)
        payload = {"ok": True, "value": value}
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        payload = {"ok": False, "traceback": traceback.format_exc()}
    finally:
        try:
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001
            if payload.get("ok", False):
                payload = {"ok": False, "traceback": "destroy_process_group failed:\n" + traceback.format_exc()}
    _settle_native_threads()
    _write_result(result_path, payload)


def _thread_states() -> list[str]:
    """The scheduler state (R, S, D, ...) of every thread of this process but the calling one."""
    me, states = threading.get_native_id(), []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


def _settle_native_threads(quiet_polls: int = 3, cap_s: float = 5.0) -> None:
    """Before the interpreter finalizes, let the other threads finish what they were doing.

    DDP keeps its process group alive past destroy_process_group, so a gloo worker thread still runs at exit, and
    it may drop its last reference to a finished Work a moment after the rank moved on. When that Work holds a
    tensor that Python code made (a Python comm hook's, torch's own fp16_compress_hook included), the drop takes
    the GIL; during finalization that ends the thread by unwinding it, and the process aborts with "terminate
    called without an active exception" (pytorch/pytorch#179291; reproduced with gloo's threads starved by nice 19
    against busy loops: 7 of 12 launches). So the rank sleeps, the GIL free, until every other thread sleeps
    (state S) at `quiet_polls` polls in a row, or `cap_s` passes: a bounded wait, not a check."""
    deadline, quiet = time.monotonic() + cap_s, 0
    while quiet < quiet_polls and time.monotonic() < deadline:
        time.sleep(0.002)
        quiet = quiet + 1 if all(s == "S" for s in _thread_states()) else 0


def _read_result(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception:  # noqa: BLE001
        return {"ok": False, "traceback": "result file unreadable:\n" + traceback.format_exc()}


def launch(world_size: int, fn: Callable, *args, backend: str = "tuned", timeout_s: float = DEFAULT_TIMEOUT_S,
           env: dict[str, str] | None = None, init: bool = True, pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S,
           return_exceptions: bool = False, failure_grace_s: float | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; return their values by rank.

    ``env`` is added to the children's environment (a value of None removes the variable). With
    ``return_exceptions=True`` failed ranks yield a :class:`RankFailure` instead of raising :class:`LaunchError`.
    Once a rank has failed the others get ``failure_grace_s`` to finish before they are killed (default 30 s, or
    90 s with ``return_exceptions=True``).
    """
    if failure_grace_s is None:
        failure_grace_s = EXPECTED_FAILURE_GRACE_S if return_exceptions else FAILURE_GRACE_S
    # Caps for a run with a hard budget per step (benchmarks/gpu_check.sh): a hang then ends inside the launch, with
    # the ranks' stacks, instead of the step's timeout killing pytest before it reports anything.
    if os.environ.get("TUNEDIST_TEST_LAUNCH_TIMEOUT_S"):
        timeout_s = min(timeout_s, float(os.environ["TUNEDIST_TEST_LAUNCH_TIMEOUT_S"]))
    if os.environ.get("TUNEDIST_TEST_PG_TIMEOUT_S"):
        pg_timeout_s = min(pg_timeout_s, float(os.environ["TUNEDIST_TEST_PG_TIMEOUT_S"]))
    assert world_size >= 1
    ctx = _context(env)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tunedist_launch_") as result_dir:
        paths = [Path(result_dir) / f"rank{r}.pt" for r in range(world_size)]
        procs = []
        base_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size)}
        try:
            for rank in range(world_size):
                child_env = {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {})}
                # A spawned child inherits the patched environment; a forked one sets the snapshot itself.
                with patched_environ(child_env):
                    p = ctx.Process(target=_worker, name=f"tunedist-rank{rank}",
                                    args=(rank, world_size, port, fn, args, backend, init, pg_timeout_s, result_dir,
                                          dict(os.environ)))
                    p.start()
                procs.append(p)
            killed = _wait(procs, paths, timeout_s, failure_grace_s)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)
        results = [_read_result(path) for path in paths]

    values: list = []
    failures: list[RankFailure] = []
    for rank, (p, res) in enumerate(zip(procs, results)):
        why = killed.get(rank)
        if res is not None and res.get("ok") and why is None and p.exitcode == 0:
            values.append(res["value"])
            continue
        if res is not None and not res.get("ok"):
            failure = RankFailure(rank, p.exitcode, res.get("traceback"), "raised")
        elif res is not None and why is not None:
            failure = RankFailure(rank, p.exitcode, None, f"returned but did not exit ({why})")
        elif res is not None:
            failure = RankFailure(rank, p.exitcode, None, "returned, then exited with a non-zero code")
        else:
            failure = RankFailure(rank, p.exitcode, None, why or "died without reporting a result")
        failures.append(failure)
        values.append(failure)
    if failures and not return_exceptions:
        name = getattr(fn, "__qualname__", repr(fn))
        raise LaunchError(f"launch({world_size}, {name}) failed on {len(failures)} of {world_size} ranks:\n\n"
                          + "\n\n".join(str(f) for f in failures))
    return values


def _dump_stacks(proc) -> None:
    """Asks a straggler to print its threads' Python stacks (to the captured stderr) before it is killed, and,
    where gdb is installed, prints every thread's native stack too (a hang inside C++ shows no Python frame)."""
    try:
        os.kill(proc.pid, signal.SIGUSR1)
    except OSError:
        return
    time.sleep(1.0)
    gdb = shutil.which("gdb")
    if gdb is None:
        return
    try:
        out = subprocess.run([gdb, "-p", str(proc.pid), "-batch", "-nx", "-ex", "set pagination off",
                              "-ex", "thread apply all bt 40"], capture_output=True, text=True, timeout=60)
        frames = [line for line in out.stdout.splitlines() if line.startswith(("Thread ", "#"))]
        print(f"native stacks of pid {proc.pid}:\n" + "\n".join(frames), file=sys.stderr)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"native stacks of pid {proc.pid}: gdb failed: {e}", file=sys.stderr)


def _wait(procs, paths, timeout_s: float, failure_grace_s: float) -> dict[int, str]:
    """Wait for every child; kill stragglers. Returns {rank: why it was killed}."""
    deadline = time.monotonic() + timeout_s
    first_failure_at = None
    reported_at: dict[int, float] = {}
    exited: set[int] = set()
    killed: dict[int, str] = {}
    while True:
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r not in reported_at and paths[r].exists():
                reported_at[r] = now
                res = _read_result(paths[r])
                if (res is None or not res.get("ok")) and first_failure_at is None:
                    first_failure_at = now
            if r not in exited and not p.is_alive():
                exited.add(r)
                res = _read_result(paths[r])
                if (p.exitcode != 0 or res is None or not res.get("ok")) and first_failure_at is None:
                    first_failure_at = now
        alive = [r for r in range(len(procs)) if r not in exited]
        if not alive:
            return killed
        for r in alive:
            why = None
            if now >= deadline:
                why = f"killed after the launch timeout of {timeout_s:.0f} s (hang?)"
            elif first_failure_at is not None and now - first_failure_at > failure_grace_s:
                why = f"killed {failure_grace_s:.0f} s after another rank failed"
            elif r in reported_at and now - reported_at[r] > EXIT_GRACE_S:
                why = f"still alive {EXIT_GRACE_S:.0f} s after reporting its result"
            if why is not None:
                _dump_stacks(procs[r])
                procs[r].kill()
                procs[r].join(timeout=10)
                killed[r] = why
                exited.add(r)
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------------------
# Deterministic inputs and reference reductions, computed inside the ranks by the collective tests.
#
# The references do what the engine does: reduce in rank order 0..P-1, fp16/bf16 accumulated in fp32 and rounded
# once, integers wrapping modulo 2^bits, so results compare bit for bit.


PREMUL_FACTOR = 0.3  # not exact in binary: checks that the factor is rounded to the accumulator type once


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


_BASE_N = 300_001  # inputs up to this size are prefixes of one cached tensor per (dtype, rank, tag, kind)


def make_input(dtype: torch.dtype, n: int, rank: int, tag: str = "", kind: str = "gen") -> torch.Tensor:
    """Rank `rank`'s input for case `tag`: a fresh tensor of n elements; kind "prod" keeps products small."""
    if n <= _BASE_N:
        return _base_input(dtype, rank, tag, kind)[:n].clone()
    return _generate(dtype, n, rank, tag, kind)


@functools.lru_cache(maxsize=64)
def _base_input(dtype: torch.dtype, rank: int, tag: str, kind: str) -> torch.Tensor:
    return _generate(dtype, _BASE_N, rank, tag, kind)


def _generate(dtype: torch.dtype, n: int, rank: int, tag: str, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(str(dtype), n, rank, tag, kind))
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.8
    if dtype.is_floating_point:
        if kind == "prod":
            return (torch.rand(n, generator=g) + 0.5).to(dtype)
        return (torch.randn(n, generator=g) * 4).to(dtype)
    info = torch.iinfo(dtype)
    if kind == "prod":
        lo, hi = {torch.int8: (-4, 5), torch.uint8: (0, 16), torch.int32: (-300, 301)}.get(dtype, (-1000, 1001))
    elif dtype == torch.int64:
        lo, hi = -(2**60), 2**60  # four of them add up without overflowing the int64 reference
    else:
        lo, hi = info.min, info.max + 1  # full range: SUM must wrap like the two's-complement hardware
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def make_op(name: str):
    return dist._make_nccl_premul_sum(PREMUL_FACTOR) if name == "PREMUL_SUM" else getattr(dist.ReduceOp, name)


def input_kind(op: str) -> str:
    return "prod" if op == "PRODUCT" else "gen"


def reference(op: str, terms: list[torch.Tensor]) -> torch.Tensor:
    """The engine's reduction of `terms` (in rank order), computed with torch."""
    dtype = terms[0].dtype
    n = len(terms)
    if dtype == torch.bool:
        fold = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
                "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
                "BXOR": torch.logical_xor}[op]
        acc = terms[0].clone()
        for t in terms[1:]:
            acc = fold(acc, t)
        return acc
    if dtype.is_floating_point:
        acc_t = torch.float64 if dtype == torch.float64 else torch.float32
        xs = [t.to(acc_t) for t in terms]
        if op == "PREMUL_SUM":
            f = torch.tensor(PREMUL_FACTOR, dtype=acc_t)
            xs = [x * f for x in xs]
    else:
        xs = [t.to(torch.int64) for t in terms]  # then narrowed modulo 2^bits, like the engine's wrapping ops
    combine = {"SUM": torch.add, "AVG": torch.add, "PREMUL_SUM": torch.add, "PRODUCT": torch.mul,
               "MIN": torch.minimum, "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
               "BXOR": torch.bitwise_xor}[op]
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = combine(acc, x)
    if op == "AVG":
        acc = acc / torch.full_like(acc, n)  # tensor / tensor: an IEEE division per element, as in the kernel
    return acc.to(dtype)


def tensor_bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t (bools as 0/1), for bitwise comparison and hashing."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """"" if the tensors are bitwise equal (same dtype and shape), else what differs and where first."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"got {actual.dtype}{tuple(actual.shape)}, expected {expected.dtype}{tuple(expected.shape)}"
    a, e = tensor_bits(actual), tensor_bits(expected)
    if torch.equal(a, e):
        return ""
    es = actual.element_size() if actual.dtype != torch.bool else 1
    bad = (a.view(-1, es) != e.view(-1, es)).any(dim=1).nonzero().reshape(-1)
    i = int(bad[0])
    return (f"{bad.numel()} of {actual.numel()} elements differ; first at flat index {i}: got "
            f"{actual.reshape(-1)[i].item()!r}, expected {expected.reshape(-1)[i].item()!r}")
