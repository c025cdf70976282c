"""How much of /dev/shm the `tuned` backend needs, and the check of /dev/shm against it.

A `tuned` group reserves one segment per host at construction and fills every page of it up front
(csrc/shm/comm.cpp, layout.h: SegmentGeometry)::

    [header: 1 page] [P control blocks of RANK_CTL_BYTES] [P heap tables of HEAP_TABLE_BYTES, together rounded
    up to a page] [P ranks x 2 buffers x slot]

with the slot size from ``TUNEDIST_SLOT_BYTES`` (default 1 MiB, csrc/shm/options.h). The constants below mirror the
C++ layout; tests/python/test_doctor.py compares :func:`group_shm_bytes` with the bytes a real group reports
(``tunedist._C.reserved_shm_bytes``) so that a change on either side shows up there. Send/recv adds one ring of
``P2P_CHANNEL_BYTES`` plus a page per ordered pair of ranks that talk, created on first use (not counted here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..nccl_env import Finding

PAGE_BYTES = 4096  # layout.h kPage
NUM_BUFFERS = 2  # layout.h kNumBuffers: each rank's slots are double-buffered
RANK_CTL_BYTES = 1920  # sizeof(layout.h RankCtl): step, heartbeat, life lock, two 56-byte OpDescs in two lines,
# 72 12-byte probe verdicts (RoundVerdict: 9 families x 8 size classes) in fourteen, and 44 16-byte path verdicts
# (PathVerdict: 4 collectives x 11 size classes) in eleven
HEAP_TABLE_BYTES = 64 + 32 * 128  # sizeof(layout.h HeapTable): a count, then 32 chunk entries of two lines
DEFAULT_SLOT_BYTES = 1 << 20  # options.h ShmOptions::kDefaultSlotBytes
MAX_SLOT_BYTES = 1 << 30  # options.cpp ShmOptions::validate
P2P_CHANNEL_BYTES = 256 << 10  # options.h ShmOptions::kDefaultP2pChannelBytes
SLOT_ENV = "TUNEDIST_SLOT_BYTES"
SHM_DIR = "/dev/shm"
# Above this share of the free space the segments leave too little for the rest of the job: DataLoader workers
# hand every batch to the main process through /dev/shm, and other jobs on the host use it too.
DEFAULT_MAX_SHARE = 0.5


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def slot_bytes_from_env(env: Mapping[str, str] | None = None) -> int:
    """The slot size a group created with this environment uses; ValueError with the rule when it is invalid."""
    env = os.environ if env is None else env
    text = env.get(SLOT_ENV, "").strip()
    if not text:
        return DEFAULT_SLOT_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{SLOT_ENV}={text!r} is not an integer") from None
    if value < PAGE_BYTES or value % PAGE_BYTES or value > MAX_SLOT_BYTES:
        raise ValueError(f"{SLOT_ENV}={value} must be a multiple of {PAGE_BYTES} between {PAGE_BYTES} and "
                         f"{MAX_SLOT_BYTES}: group creation would fail")
    return value


def group_shm_bytes(ranks_on_host: int, slot_bytes: int | None = None) -> int:
    """Bytes of /dev/shm one `tuned` group of `ranks_on_host` ranks reserves (slot_bytes None: from the env)."""
    if ranks_on_host < 1:
        raise ValueError(f"group_shm_bytes: ranks_on_host must be >= 1, got {ranks_on_host}")
    slot = slot_bytes_from_env() if slot_bytes is None else slot_bytes
    control = _round_up(PAGE_BYTES + (RANK_CTL_BYTES + HEAP_TABLE_BYTES) * ranks_on_host, PAGE_BYTES)
    return control + ranks_on_host * NUM_BUFFERS * slot


@dataclass(frozen=True)
class ShmSpace:
    total: int
    free: int

    @classmethod
    def of(cls, path: str = SHM_DIR) -> ShmSpace:
        vfs = os.statvfs(path)
        return cls(vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_shm(ranks_on_host: int, env: Mapping[str, str], groups: int = 1, shm_dir: str = SHM_DIR,
              max_share: float = DEFAULT_MAX_SHARE) -> Finding:
    """fail: the groups' segments do not fit in the free space; warn: they take more than max_share of it."""
    check = "shm.size"
    try:
        slot = slot_bytes_from_env(env)
    except ValueError as exc:
        return Finding(check, "fail", str(exc), f"unset {SLOT_ENV} or fix its value")
    try:
        space = ShmSpace.of(shm_dir)
    except OSError as exc:
        return Finding(check, "fail", f"cannot stat {shm_dir}: {exc}; POSIX shared memory is unavailable",
                       "mount a tmpfs on /dev/shm (containers: --ipc=host or --shm-size)")
    need = groups * group_shm_bytes(ranks_on_host, slot)
    how = (f"{groups} tuned group(s) x {ranks_on_host} ranks x {NUM_BUFFERS} x {_mib(slot)} slots + control pages "
           f"= {_mib(need)}; {shm_dir}: {_mib(space.free)} free of {_mib(space.total)}")
    smaller = max(PAGE_BYTES, slot // 4 // PAGE_BYTES * PAGE_BYTES)
    fix = (f"grow {shm_dir} (docker run --shm-size=<bytes> or --ipc=host; Kubernetes: an emptyDir with medium "
           f"Memory on /dev/shm), or use smaller slots ({SLOT_ENV}={smaller})")
    if need > space.free:
        return Finding(check, "fail", how + ": the first collective fails", fix)
    if need > max_share * space.free:
        return Finding(check, "warn", how + f": over {max_share:.0%} of the free space, little is left for "
                       "DataLoader workers", fix)
    return Finding(check, "ok", how)
