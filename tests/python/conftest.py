"""pytest setup for tests/python.

* ``tests/python`` is importable (``from dist_utils import launch``), also for the ranks (dist_utils.START_METHOD).
* The source tree's ``python/`` directory is put on sys.path only when no tunedist is installed, so CI tests the
  installed package while a source tree with a built ``_C`` in ``python/tunedist`` works too.
* Every test must leave no ``/dev/shm/tunedist_*`` entry behind.
* Tests that start rank processes, a torchrun or a build are marked ``slow``: ``./dev test --quick`` runs
  ``pytest -m "not slow"``, the in-process tests (see _QUICK_MODULES), while ``./dev test`` and CI run everything.
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

# The quick tier: modules whose tests all run in this process, and, in modules that also start rank processes, the
# tests that do not. Every other test is marked slow, so a new module or test joins the quick tier only when it is
# named here (it then must stay in-process: a few seconds at most).
_QUICK_MODULES = {"test_docs_links.py", "test_hooks_kernels.py", "test_lint.py", "test_nccl_env.py"}
_QUICK_TESTS = {
    "test_backend_api.py": {"test_registration"},
    "test_direct_op.py": {"test_no_default_group"},
    "test_doctor.py": {"test_group_shm_bytes_matches_real_backend", "test_shm_check_verdicts",
                       "test_static_without_group_skips_backends_honestly", "test_data_parallel_flagged",
                       "test_threads_against_cores", "test_fetch_time_decision",
                       "test_scaled_lr_and_warmup_grow_with_global_batch",
                       "test_linear_scaling_scheduler_ramps_then_holds", "test_report_table_and_json"},
    "test_hooks_state.py": {"test_state_attributes_like_torch"},
    "test_tune.py": {"test_fit_recovers_alpha_beta", "test_fit_reports_a_bad_fit_and_rejects_bad_input",
                     "test_assign_buckets_follows_ddp_rules", "test_simulate_one_comm_stream",
                     "test_candidates_and_ddp_arguments", "test_select_trials_hedges_the_contention",
                     "test_calibrated_comm_model", "test_choose_trial_needs_a_clear_win_to_overrule_the_prediction"},
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts rank processes, a torchrun or a build; left out of "
                            "./dev test --quick (pytest -m 'not slow')")


def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        module = item.path.name
        name = item.originalname if hasattr(item, "originalname") else item.name
        if module in _QUICK_MODULES or name in _QUICK_TESTS.get(module, ()):
            seen.add((module, name))
        else:
            item.add_marker(pytest.mark.slow)
    # A quick test that was renamed or removed must leave the list too, or the tier silently shrinks. Checked when
    # whole modules were collected (no node ids, no -k).
    if config.getoption("keyword") or any("::" in arg for arg in config.args):
        return
    collected = {item.path.name for item in items}
    missing = sorted(f"{module}::{name}" for module, names in _QUICK_TESTS.items() if module in collected
                     for name in names if (module, name) not in seen)
    if missing:
        raise pytest.UsageError(f"tests/python/conftest.py names quick tests that do not exist: {missing}")


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
