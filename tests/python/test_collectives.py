"""Every collective of the ``tuned`` backend, in real processes, against closed-form values.

(Init variants, backend strings and TORCH_DISTRIBUTED_DEBUG live in test_backend_api.py; the random mix in
test_soak.py.)

One launch per world size (1, 2, 3, 4) runs every check (collective_checks.py: reductions;
collective_checks_movement.py: the rest) inside the ranks (``_run_all_checks``); each pytest
test then reports one section of that run, so a failure names its collective, dtype, size, root and rank while the
suite pays for process start-up only four times. Each rank computes the expected values itself from the inputs of
every rank, which are deterministic functions of (case, rank). Reductions are compared bit for bit: the engine
reduces in rank order 0..P-1, accumulating fp16/bf16 in fp32 and rounding once, and so do the references here.
"""

from __future__ import annotations

import pytest

import collective_checks as reductions
import collective_checks_movement as movement
from collective_checks import Checker, section_problems
from dist_utils import launch

WORLD_SIZES = [pytest.param(n, id=f"w{n}") for n in (1, 2, 3, 4)]

SECTIONS = {
    "all_reduce": reductions.check_all_reduce,
    "all_reduce_coalesced": reductions.check_all_reduce_coalesced,
    "broadcast": reductions.check_broadcast,
    "reduce": reductions.check_reduce,
    "all_gather": movement.check_all_gather,
    "all_gather_into_tensor": movement.check_all_gather_into_tensor,
    "all_gather_coalesced": movement.check_all_gather_coalesced,
    "gather_scatter": movement.check_gather_scatter,
    "reduce_scatter": reductions.check_reduce_scatter,
    "all_to_all": movement.check_all_to_all,
    "all_to_all_single": movement.check_all_to_all_single,
    "barrier_and_objects": movement.check_barrier_and_objects,
    "functional": movement.check_functional,
    "zero_size": movement.check_zero_size,
    "non_contiguous": movement.check_non_contiguous,
    "async": movement.check_async,
    "groups": movement.check_groups,
}


# torch's first functional collective imports torch._dynamo and inductor: several seconds of CPU per rank, which
# buys nothing at larger world sizes (the plain collectives underneath are checked there).
ONLY_AT = {"functional": (2,)}


def _run_sections(rank: int, world_size: int, names) -> dict:
    c = Checker(rank, world_size)
    for name in names:
        c.run(name, SECTIONS[name])
    return {"failures": dict(c.failures), "digests": dict(c.digests), "ran": c.ran, "seconds": c.seconds}


def _run_all_checks(rank: int, world_size: int) -> dict:
    return _run_sections(rank, world_size, [n for n in SECTIONS if world_size in ONLY_AT.get(n, (world_size,))])


# ---------------------------------------------------------------------------------------------------------------
# pytest side: one launch per world size, one test per section.


@pytest.fixture(scope="module", params=WORLD_SIZES)
def matrix(request):
    world_size = request.param
    try:
        results = launch(world_size, _run_all_checks, timeout_s=420)
        print(f"\nworld size {world_size}, seconds per section on rank 0: "
              + ", ".join(f"{k} {v:.1f}" for k, v in results[0]["seconds"].items()))
        return world_size, results, None
    except AssertionError as exc:
        return world_size, None, exc


@pytest.mark.parametrize("section", list(SECTIONS))
def test_collective(matrix, section):
    world_size, results, error = matrix
    if world_size not in ONLY_AT.get(section, (world_size,)):
        pytest.skip(f"{section} is checked at world sizes {ONLY_AT[section]} only (torch's first use costs seconds)")
    if error is not None:
        pytest.fail(f"the world-size-{world_size} run failed:\n{error}", pytrace=False)
    problems = section_problems(section, world_size, results)
    if problems:
        pytest.fail(f"{section} with world size {world_size}:\n" + "\n".join(problems), pytrace=False)


# The copy out of the peers' slots uses cached stores up to TUNEDIST_CACHED_COPY_MAX_BYTES received (broadcast:
# TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES) and streaming stores above, and the copy into a rank's own slot chooses
# between them at run time (TUNEDIST_SLOT_STORES=auto); the sizes above mostly take the cached paths. One more
# launch, with streaming stores both ways for every size and 4 KiB slots (so every call also runs many chunks), for
# the collectives that copy through slots.
STREAMING_SECTIONS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather_scatter",
                      "reduce_scatter", "all_to_all", "all_to_all_single")


@pytest.fixture(scope="module")
def streaming_run():
    env = {"TUNEDIST_CACHED_COPY_MAX_BYTES": "0", "TUNEDIST_BROADCAST_CACHED_COPY_MAX_BYTES": "0",
           "TUNEDIST_SLOT_STORES": "streaming", "TUNEDIST_SLOT_BYTES": "4096"}
    try:
        return launch(3, _run_sections, STREAMING_SECTIONS, timeout_s=420, env=env), None
    except AssertionError as exc:
        return None, exc


@pytest.mark.parametrize("section", STREAMING_SECTIONS)
def test_collective_streaming_stores(streaming_run, section):
    results, error = streaming_run
    if error is not None:
        pytest.fail(f"the world-size-3 run with streaming slot stores failed:\n{error}", pytrace=False)
    problems = section_problems(section, 3, results)
    if problems:
        pytest.fail(f"{section} with streaming slot stores and 4 KiB slots:\n" + "\n".join(problems), pytrace=False)
