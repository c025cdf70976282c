"""pytest setup for tests/python.

* ``tests/python`` is importable (``from dist_utils import launch``), also for the ranks (dist_utils.START_METHOD).
* The source tree's ``python/`` directory is put on sys.path only when no tunedist is installed, so CI tests the
  installed package while a developer tree (``/tmp/inplace_build.sh`` or ``PYTHONPATH=python``) works too.
* Every test must leave no ``/dev/shm/tunedist_*`` entry behind.
"""

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_REPO_PYTHON = _HERE.parents[1] / "python"

if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
if importlib.util.find_spec("tunedist") is None and (_REPO_PYTHON / "tunedist").is_dir():
    sys.path.insert(0, str(_REPO_PYTHON))
    # The ranks get sys.path from multiprocessing, but subprocesses started by tests need it too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_PYTHON), os.environ.get("PYTHONPATH")]))

from dist_utils import shm_entries  # noqa: E402

# Segments are unlinked once every rank has mapped them, but a group another process is setting up right now may
# show up for a moment: give new names this long to disappear before calling them leaked.
_SHM_SETTLE_S = 3.0


def _held_open(names: set) -> set:
    """The names among `names` that a live process still holds open or mapped (another job of this user, mid-setup:
    a segment is unlinked once every rank has mapped it, and its creator may have closed its descriptor by then)."""
    held = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        targets = []
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    targets.append(os.readlink(fd))
                except OSError:
                    continue
            with open(proc / "maps") as maps:
                targets += [line.split(None, 5)[5].strip() for line in maps if "/dev/shm/" in line]
        except (OSError, IndexError):
            continue
        for target in targets:
            if target.startswith("/dev/shm/") and target[len("/dev/shm/"):] in names:
                held.add(target[len("/dev/shm/"):])
    return held


@pytest.fixture(autouse=True)
def no_leaked_shm():
    before = shm_entries()
    yield
    leaked = shm_entries() - before
    deadline = time.monotonic() + _SHM_SETTLE_S
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked &= shm_entries()
    # The test's own processes have exited by now, so a name some live process holds belongs to another job.
    leaked -= _held_open(leaked)
    assert not leaked, (f"the test left shared memory behind in /dev/shm: {sorted(leaked)} (nobody holds it open; "
                        "if other tunedist jobs of this user ran meanwhile, one of them may have left it)")
