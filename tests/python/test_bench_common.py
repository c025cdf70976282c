"""benchmarks/_common.py, the helpers the research tools in benchmarks/ share: sizes against their closed form in
bytes, percentiles and spreads against hand-computed values, the timing loops' call counts, the record's metadata,
and that bench_ab_builds.py loads where tunedist.bench does not exist (an older build)."""

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def _load_common():
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load_common()


@pytest.mark.parametrize("text,value", [
    ("8", 8), ("0", 0), ("4K", 4 * 1024), ("4k", 4 * 1024), ("64KiB", 64 * 1024), ("2MB", 2 * 1024 ** 2),
    ("256M", 256 * 1024 ** 2), ("1g", 1024 ** 3), ("3GiB", 3 * 1024 ** 3), (" 16 K ", 16 * 1024), ("5B", 5),
])
def test_parse_size_is_bytes_in_binary_units(text, value):
    assert common.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "1.5M", "-4K", "4T", "4 KB B", "0x10"])
def test_parse_size_names_a_bad_size(text):
    with pytest.raises(argparse.ArgumentTypeError, match="bad size"):
        common.parse_size(text)


def test_parse_sizes_takes_a_comma_separated_list():
    assert common.parse_sizes("4K,64K,1M") == [4096, 65536, 1 << 20]
    assert common.parse_sizes(" 16K , ,8 ") == [16384, 8]
    with pytest.raises(argparse.ArgumentTypeError, match="no size"):
        common.parse_sizes(" , ")


def test_percentile_and_spread_against_hand_computed_values():
    values = [7.0, 1.0, 5.0, 3.0, 9.0, 2.0, 8.0, 4.0, 6.0, 10.0]  # 1..10, unsorted
    # The value at rank round(q x n), 1-based: q 0.1 -> 1st, 0.5 -> 5th, 0.9 -> 9th, 0.99 -> 10th; q 0 -> the first.
    assert [common.percentile(values, q) for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)] == [1, 1, 5, 9, 10, 10]
    assert common.percentile([4.0], 0.9) == 4.0
    assert common.spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0}
    assert common.spread([2.0], "ratio_") == {"ratio_median": 2.0, "ratio_min": 2.0, "ratio_max": 2.0}


@pytest.mark.parametrize("timer", ["per_call_us", "loop_mean_s"])
def test_timing_loops_make_exactly_the_calls_asked_for(timer):
    calls = []
    result = getattr(common, timer)(lambda: calls.append(1), 7)
    assert len(calls) == 7 and result >= 0


def test_run_meta_names_torch_and_the_imported_build():
    import tunedist

    meta = common.run_meta()
    assert meta["torch"] == torch.__version__ and meta["tunedist_file"] == tunedist.__file__
    assert meta["tunedist"] == tunedist.version() and meta["simd"] == tunedist.simd_level()
    assert "world_size" not in meta  # no process group here


def test_ab_builds_loads_without_the_benchmark_package():
    """bench_ab_builds.py runs against older builds, which have no tunedist.bench: its shared code comes from
    benchmarks/, so it loads and parses its sizes with tunedist.bench unimportable."""
    code = ("import sys; sys.modules['tunedist.bench'] = None; sys.path.insert(0, sys.argv[1]); "
            "import bench_ab_builds as ab; print(ab.parse_sizes(ab.DEFAULT_SIZES))")
    proc = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == str([64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20])
