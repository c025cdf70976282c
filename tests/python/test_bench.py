"""The benchmark harness (python -m tunedist.bench) and the DDP example, run for real on 2 ranks at tiny sizes.

These check the harness, not the speed: the JSON schema, the interleaved rounds and the ratio summary, #wrong == 0
for every backend, op and variant, tuned+sym (symmetric buffers) running zero-copy beside tuned, DeepSpeed as a
contender (when it is installed) and its absence, that the example trains over `tuned`, and that the FSDP2 benchmark
(benchmarks/bench_fsdp_symmetric.py) runs zero-copy with equal losses. No timing is asserted.
"""

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tunedist
from tunedist.bench import report, symmetric
from tunedist.bench.__main__ import parse_args, parse_size
from tunedist.bench.collectives import MORE_COLLECTIVES, PRIMARY_INPLACE, VARIANTS
from tunedist.bench.plot import plot

REPO = Path(__file__).resolve().parents[2]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
RUN_TIMEOUT_S = 150
DS_TIMEOUT_S = 900  # DeepSpeed JIT-builds its shm op at its first use on a machine (minutes), then caches it
ROUNDS = 2
RESULT_KEYS = {"backend": str, "op": str, "dtype": str, "bytes": int, "count": int, "inplace": bool, "iters": int,
               "time_us": float, "p10_us": float, "p50_us": float, "p90_us": float, "p99_us": float,
               "algbw_gbps": float, "busbw_gbps": float, "wrong": int, "cpu_us": float, "cpu_all_ranks_us": float,
               "rounds": int, "round_time_us": list, "path": str}
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _torchrun(*argv, world_size=2, rc=0, timeout=RUN_TIMEOUT_S, unset=(), extra_env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}  # PYTHONPATH (conftest's, if set) is kept
    for name in unset:
        env.pop(name, None)
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    assert proc.returncode == rc, f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout[-8000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    text = _torchrun("-m", "tunedist.bench", "--backends", "tuned,gloo", "--ops", ",".join(OPS), "-b", "8",
                     "-e", "64K", "-n", "5", "-w", "1", "--rounds", str(ROUNDS), "--memcpy-bytes", "8M",
                     "--no-progress", "--json", str(out), "--plot", str(out.with_suffix(".png")))
    return json.loads(out.read_text()), text


def test_bench_measures_the_other_nccl_tests_ops(tmp_path):
    """all_to_all, reduce, gather and scatter, named in --ops: every point checked against its closed form on both
    backends (#wrong 0), in the variant each has, and the tables print them."""
    more = list(MORE_COLLECTIVES)
    out = tmp_path / "more.json"
    text = _torchrun("-m", "tunedist.bench", "--backends", "tuned,gloo", "--ops", ",".join(more), "-b", "4K", "-e",
                     "64K", "-f", "16", "-n", "3", "-w", "1", "--rounds", "1", "--memcpy-bytes", "1M", "--no-progress",
                     "--json", str(out))
    data = json.loads(out.read_text())
    seen = {(r["backend"], r["op"], r["inplace"], r["bytes"]) for r in data["results"]}
    assert seen == {(b, op, ip, n) for b in ("tuned", "gloo") for op in more for ip in VARIANTS[op]
                    for n in (4096, 65536)}
    assert all(r["wrong"] == 0 for r in data["results"]), data["results"]
    for op in more:
        assert f"backend tuned: {op}" in text and f"backend gloo: {op}" in text


def test_bench_json_schema(bench_run):
    data, _ = bench_run
    assert data["world_size"] == 2
    assert data["memcpy_gbps"] > 0 and data["memcpy_gbps_end"] > 0
    # The bound is taken over both probes (before the first point and after the last).
    mean = (data["memcpy_gbps"] + data["memcpy_gbps_end"]) / 2
    assert data["bound"]["memcpy_gbps"] == pytest.approx(mean)
    assert data["bound"]["busbw_gbps"] == pytest.approx(data["bound"]["factor"] * mean)
    assert data["threads"]["torch_num_threads"] == 1 and "OMP_NUM_THREADS" in data["threads"]
    assert isinstance(data["simd"], str) and data["torch"]
    assert data["rounds"] == ROUNDS and data["backends"] == ["tuned", "gloo"] and data["skipped"] == []
    assert all(len(data[k]) == 3 and min(data[k]) >= 0 for k in ("load_avg_start", "load_avg_end"))
    for row in data["results"]:
        for key, kind in RESULT_KEYS.items():
            assert isinstance(row[key], kind), f"{key} of {row} is not a {kind.__name__}"
        assert row["path"] == "c10d" and row["rounds"] == len(row["round_time_us"]) == ROUNDS
        assert row["time_us"] == pytest.approx(statistics.median(row["round_time_us"]), rel=1e-9)
        assert 0 < row["p10_us"] <= row["p50_us"] <= row["p90_us"] <= row["p99_us"]
        assert math.isclose(row["algbw_gbps"], row["bytes"] / row["time_us"] / 1e3, rel_tol=1e-6)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(row["op"], 0.5)  # 2(n-1)/n, 1, (n-1)/n at n = 2
        assert math.isclose(row["busbw_gbps"], row["algbw_gbps"] * factor, rel_tol=1e-6)
        # CPU time per op: every process spends some on each call (at least its Python call), 2 ranks' worth in all.
        assert row["cpu_us"] > 0 and math.isclose(row["cpu_all_ranks_us"], 2 * row["cpu_us"], rel_tol=1e-9)
    bound = data["bound"]
    assert math.isclose(bound["factor"], 4 / 11) and bound["busbw_gbps"] > 0
    assert set(bound["largest"]) == {"tuned", "gloo"}
    assert all(b["bytes"] == 64 << 10 and b["ratio"] > 0 for b in bound["largest"].values())


def test_bench_probes_memcpy_beside_every_round_of_the_bound_point(bench_run):
    data, text = bench_run
    rows = {(r["backend"], r["op"], r["bytes"], r["inplace"]): r for r in data["results"]}
    probed = [k for k, r in rows.items() if "memcpy_gbps_rounds" in r]
    # Only the largest all_reduce, in place, takes the probe into its rounds; both contenders share its probes.
    assert sorted(probed) == [(b, "all_reduce", 64 << 10, True) for b in ("gloo", "tuned")]
    probes = rows[probed[0]]["memcpy_gbps_rounds"]
    assert len(probes) == ROUNDS and min(probes) > 0 and rows[probed[1]]["memcpy_gbps_rounds"] == probes
    beside = data["bound"]["beside_rounds"]
    assert set(beside) == {"tuned", "gloo"}
    for backend, b in beside.items():
        r = rows[(backend, "all_reduce", 64 << 10, True)]
        for name, factor in (("copy_in_out", 4 / 11), ("peers_only", 4 / 7)):
            want = [(64 << 10) / (t * 1e3) / (factor * m) for t, m in zip(r["round_time_us"], probes)]
            assert b[name]["ratio_rounds"] == pytest.approx(want)
            assert b[name]["ratio_median"] == pytest.approx(statistics.median(want))
            assert b[name]["ratio_min"] == pytest.approx(min(want)) and b[name]["ratio_max"] == pytest.approx(max(want))
        assert f"# bound beside each round at {64 << 10} B, {backend}:" in text
        # The stand-in (tunedist.bench.standin) took a turn in every round too: its time over the round's. Where the
        # ranks cannot map each other's memory (a host that denies ptrace read access) a note says why instead.
        if "standin_us_rounds" not in r:
            assert any("stand-in not measured" in n for n in data["notes"]), data["notes"]
            continue
        standin = r["standin_us_rounds"]
        assert len(standin) == ROUNDS and all(s["best"] == min(s["torch copy"], s["streaming copy"]) > 0
                                              for s in standin)
        want = [s["best"] / t for s, t in zip(standin, r["round_time_us"])]
        assert b["standin"]["ratio_rounds"] == pytest.approx(want)
        assert b["standin"]["ratio_median"] == pytest.approx(statistics.median(want))
        assert f"# stand-in beside each round at {64 << 10} B, {backend}:" in text


def test_bench_summary_is_the_ratio_per_interleaved_round(bench_run):
    data, _ = bench_run
    rows = {(r["backend"], r["op"], r["bytes"], r["inplace"]): r for r in data["results"]}
    summary = data["summary"]
    assert {(s["op"], s["bytes"]) for s in summary} == {(op, b) for _, op, b, ip in rows if
                                                        ip == PRIMARY_INPLACE[op]}
    for s in summary:
        assert (s["backend"], s["vs"]) == ("gloo", "tuned")
        inplace = PRIMARY_INPLACE[s["op"]]
        gloo, tuned = (rows[(b, s["op"], s["bytes"], inplace)]["round_time_us"] for b in ("gloo", "tuned"))
        assert s["ratios"] == pytest.approx([g / t for g, t in zip(gloo, tuned)])
        assert s["ratio_median"] == pytest.approx(statistics.median(s["ratios"]))
        assert s["ratio_min"] <= s["ratio_median"] <= s["ratio_max"]


def test_ratios_pair_the_rounds():
    def row(backend, rounds):
        return {"backend": backend, "op": "all_reduce", "bytes": 8, "inplace": True, "round_time_us": rounds,
                "time_us": statistics.median(rounds)}
    results = [row("a", [10.0, 20.0, 40.0]), row("b", [30.0, 20.0, 80.0]), row("c", [5.0, 5.0, 5.0]),
               {**row("d", [1.0]), "time_us": None}]  # not timed: no ratio
    out = report.ratios(results, PRIMARY_INPLACE, "a")
    assert [(s["backend"], s["ratios"], s["ratio_median"], s["ratio_min"], s["ratio_max"]) for s in out] == [
        ("b", [3.0, 1.0, 2.0], 2.0, 1.0, 3.0), ("c", [0.5, 0.25, 0.125], 0.25, 0.125, 0.5)]


def test_bench_every_point_is_correct(bench_run):
    data, _ = bench_run
    wrong = [r for r in data["results"] if r["wrong"] != 0]
    assert not wrong, f"wrong elements: {wrong}"
    seen = {(r["backend"], r["op"], r["inplace"]) for r in data["results"]}
    expected = {(b, op, ip) for b in ("tuned", "gloo") for op in OPS for ip in VARIANTS[op]}
    assert seen == expected
    for backend in ("tuned", "gloo"):
        sizes = sorted(r["bytes"] for r in data["results"] if (r["backend"], r["op"], r["inplace"]) ==
                       (backend, "all_reduce", True))
        assert sizes == [8 << i for i in range(14)]  # 8 B .. 64 KiB, factor 2


@pytest.fixture(scope="module")
def sym_run(tmp_path_factory):
    """tuned beside tuned+sym at tiny sizes, every one of them zero-copy (TUNEDIST_SYMMETRIC_MIN_BYTES=0)."""
    out = tmp_path_factory.mktemp("bench_sym") / "sym.json"
    text = _torchrun("-m", "tunedist.bench", "--backends", "tuned,tuned+sym", "--ops", ",".join(OPS), "-b", "8",
                     "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--rounds", str(ROUNDS), "--memcpy-bytes", "8M",
                     "--no-progress", "--json", str(out), extra_env={"TUNEDIST_SYMMETRIC_MIN_BYTES": "0"})
    return json.loads(out.read_text()), text


def test_bench_tuned_sym_runs_zero_copy_and_right(sym_run):
    data, text = sym_run
    sym = [r for r in data["results"] if r["backend"] == "tuned+sym"]
    assert {(r["op"], r["inplace"]) for r in sym} == {(op, ip) for op in OPS for ip in VARIANTS[op]}
    assert len(sym) == len([r for r in data["results"] if r["backend"] == "tuned"])  # the same points
    for r in sym:
        assert r["wrong"] == 0 and r["time_us"] > 0, r
        # check + warm-up + each round's untimed call and loop: every one of them zero-copy, none restarted
        assert r["calls"] == 1 + 1 + ROUNDS * (1 + 3) and r["zero_copy_ops"] == r["calls"] > 0, r
        assert r["path"] == "zero-copy" and r["zero_copy_expected"] and r["copy_restarts"] == 0, r
    assert all(r["wrong"] == 0 and r["path"] == "c10d" and "zero_copy_ops" not in r for r in data["results"]
               if r["backend"] == "tuned")
    total = data["symmetric"]["tuned+sym"]
    assert total["min_bytes"] == 0 and total["zero_copy_ops"] == total["calls"] == sum(r["calls"] for r in sym) > 0
    assert total["missed"] == [] and total["reserved_bytes"] > 0 and total["peak_in_use_bytes"] > 0
    assert {s["backend"] for s in data["summary"]} == {"tuned+sym"}
    assert "# backend tuned+sym: all_gather (path zero-copy)" in text and "zero-copy/calls" in text
    assert "# summary: tuned vs tuned+sym" in text and "WARNING" not in text


def test_zero_copy_lines_warn_loudly():
    section = {"min_bytes": 1024, "forced": True, "paths": [], "zero_copy_ops": 0, "copy_restarts": 0, "calls": 12,
               "reserved_bytes": 1 << 26,
               "peak_in_use_bytes": 4096, "chunks": 1, "points": 2, "points_expected": 1,
               "missed": [{"op": "all_reduce", "bytes": 4096, "inplace": True, "zero_copy_ops": 0, "calls": 6}]}
    lines = symmetric.zero_copy_lines({"tuned+sym": section})
    assert lines[0].startswith("# tuned+sym: zero_copy_ops 0 of 12 calls") and "64.0 MiB" in lines[0]
    assert "WARNING: tuned+sym: zero_copy_ops did not grow" in lines[1]
    assert "WARNING: tuned+sym: all_reduce in-place S = 4096 B ran zero-copy in 0 of 6 calls" in lines[2]
    fine = {**section, "zero_copy_ops": 6, "missed": []}
    assert not any("WARNING" in line for line in symmetric.zero_copy_lines({"tuned+sym": fine}))
    # Measured (the default): the copying path where the group measured it faster is no shortfall; the lines say
    # which path each class keeps.
    measured = {**section, "forced": False, "points_expected": 0, "missed": [],
                "paths": [{"op": "all_gather", "bytes_from": 1 << 20, "path": "copy", "windows": 1,
                           "ns_per_byte": {"copy": 0.1, "zero-copy cached": 0.2, "zero-copy streaming": 0.3}}]}
    lines = symmetric.zero_copy_lines({"tuned+sym": measured})
    assert not any("WARNING" in line for line in lines)
    assert "measured per class from 1024 B" in lines[0]
    assert lines[1] == ("# tuned+sym: all_gather from 1.0 MiB: copy (windows 1; ns/B on rank 0: copy 0.100, "
                        "zero-copy cached 0.200, zero-copy streaming 0.300)")


def test_bench_rejects_tuned_sym_on_cuda(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--backends", "tuned,tuned+sym", "--device", "cuda"])
    assert exc.value.code == 2 and "tuned+sym measures CPU buffers" in capsys.readouterr().err


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_bench_writes_the_plot(bench_run, tmp_path_factory):
    data, _ = bench_run
    png = next(tmp_path_factory.getbasetemp().glob("bench*/bench.png"))
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def _fake_results():
    rows = []
    for backend, speed in (("tuned", 4.0), ("gloo", 1.0)):
        for op in ("all_reduce", "broadcast"):
            for k in range(4):
                nbytes = 1024 << (2 * k)
                t_us = 20 + nbytes / (speed * 1e3)
                algbw = nbytes / t_us / 1e3
                rows.append({"backend": backend, "op": op, "inplace": True, "bytes": nbytes, "time_us": t_us,
                             "algbw_gbps": algbw, "busbw_gbps": algbw})  # factor 1 for both at P = 2
    rows.append({**rows[0], "inplace": False, "time_us": 1e9})  # out-of-place all_reduce: not the summary variant
    return rows


def test_plot_draws_one_line_per_backend_and_op_and_the_bound(tmp_path):
    pytest.importorskip("matplotlib")
    results = _fake_results()
    meta = {"world_size": 2, "memcpy_gbps": 11.0, "simd": "avx2", "torch": "x",
            "bound": report.bound_section(results, 2, 11.0)}
    fig = plot(results, meta, str(tmp_path / "p.png"), PRIMARY_INPLACE)
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
    assert fig.canvas.manager is None  # a Figure of its own: pyplot holds no global figure for it
    ax_bw, ax_t = fig.axes
    assert ax_bw.get_xscale() == ax_bw.get_yscale() == ax_t.get_xscale() == ax_t.get_yscale() == "log"
    bw = {line.get_label(): line for line in ax_bw.get_lines()}
    t = {line.get_label(): line for line in ax_t.get_lines()}
    series = {f"{b} {op}" for b in ("tuned", "gloo") for op in ("all_reduce", "broadcast")}
    assert series <= set(bw) and series <= set(t)
    bound = 4 / 11 * 11.0
    (bound_label,) = [k for k in bw if "bound" in k]
    assert "all_reduce" in bound_label and list(bw[bound_label].get_ydata()) == [bound, bound]
    assert not any("broadcast" in k and "bound" in k for k in list(bw) + list(t))  # no bound defined there
    sizes = [1024 << (2 * k) for k in range(4)]
    assert list(t["all_reduce time at the bound"].get_ydata()) == pytest.approx([s / (bound * 1e3) for s in sizes])
    tuned_ar = [r for r in results if (r["backend"], r["op"], r["inplace"]) == ("tuned", "all_reduce", True)]
    assert list(t["tuned all_reduce"].get_ydata()) == [r["time_us"] for r in tuned_ar]  # the in-place variant
    assert bw["tuned all_reduce"].get_color() != bw["gloo all_reduce"].get_color()  # colour: backend
    assert bw["tuned all_reduce"].get_linestyle() != bw["tuned broadcast"].get_linestyle()  # style: op


def test_bench_prints_tables(bench_run):
    _, text = bench_run
    for backend in ("tuned", "gloo"):
        for op in OPS:
            assert f"# backend {backend}: {op}" in text
    assert "# summary: tuned vs gloo" in text and "tuned cpu us" in text and "gloo cpu us" in text
    assert f"median over {ROUNDS} rounds [min-max]" in text and f"median over {ROUNDS} interleaved rounds" in text
    assert "#wrong" in text and "busbw" in text and " p10 " in text and " p90 " in text and "load " in text


@pytest.mark.parametrize("text,value", [("8", 8), ("4K", 4096), ("64KiB", 65536), ("256M", 256 << 20),
                                        ("1g", 1 << 30), ("2MB", 2 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("argv,message", [
    (["--ops", "all_reduce,alltoall"], "unknown op"),
    (["--backends", "tuned,nosuch"], "unknown backend"),
    (["--backends", "gloo", "-b", "1M", "-e", "4K"], "--min-bytes"),
    (["-e", "12Q"], "bad size"),
], ids=["op", "backend", "range", "size"])
def test_bench_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


DS_ENV = ("DS_ACCELERATOR", "LOCAL_SIZE")


def test_bench_without_deepspeed_says_how_to_install_it(tmp_path):
    """Absence, simulated honestly: a `deepspeed` first on PYTHONPATH that fails to import as a missing one does."""
    pkg = tmp_path / "shim" / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'deepspeed'\", name='deepspeed')\n")
    env = {k: v for k, v in os.environ.items() if k not in DS_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg.parent), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tunedist.bench", "--backends", "tuned,deepspeed"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert "pip install deepspeed" in proc.stderr and "DS_ACCELERATOR=cpu LOCAL_SIZE=" in proc.stderr
    assert "No module named 'deepspeed'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv,env,message", [
    ([], {"DS_ACCELERATOR": "cuda"}, "deepspeed here needs DS_ACCELERATOR=cpu"),
    ([], {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, "every rank on one host"),
    ([], {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_SIZE": "3"}, "needs DS_ACCELERATOR=cpu LOCAL_SIZE=2"),
    (["--device", "cuda"], {}, "drop --device cuda"),
], ids=["accelerator", "hosts", "local_size", "cuda"])
def test_bench_names_the_environment_deepspeed_needs(argv, env, message, monkeypatch, capsys):
    for name in (*DS_ENV, "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--backends", "tuned,deepspeed", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _ds_segments() -> set:
    return {p.name for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*")}


needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (optional)")


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory):
    out, before = tmp_path_factory.mktemp("bench_ds") / "ds.json", _ds_segments()
    text = _torchrun("-m", "tunedist.bench", "--backends", "tuned,deepspeed", "--ops", "all_reduce,broadcast", "-b",
                     "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--rounds", str(ROUNDS), "--memcpy-bytes",
                     "8M", "--no-progress", "--json", str(out), timeout=DS_TIMEOUT_S, unset=DS_ENV)
    return json.loads(out.read_text()), text, _ds_segments() - before


@needs_deepspeed
def test_bench_times_deepspeed_all_reduce_right(ds_run):
    data, text, left = ds_run
    ds = [r for r in data["results"] if r["backend"] == "deepspeed"]
    assert {r["op"] for r in ds} == {"all_reduce"} and len(ds) == 2 * 3  # 2 variants x 64 B, 512 B, 4 KiB
    for r in ds:
        assert r["dtype"] == "float32" and r["wrong"] == 0 and r["path"] == "shm" and r["time_us"] > 0, r
        assert len(r["round_time_us"]) == ROUNDS
    info = data["contenders"]["deepspeed"]
    assert (info["DS_ACCELERATOR"], info["LOCAL_SIZE"]) == ("cpu", "2")  # set by the bench, not by us
    assert info["segment_unlinked"] and not left  # DeepSpeed leaves its shm workspaces; the bench unlinks them
    assert data["skipped"] == [{"backend": "deepspeed", "op": "broadcast", "reason": "deepspeed has all_reduce only"}]
    assert {s["backend"] for s in data["summary"]} == {"deepspeed"}
    assert "# backend deepspeed: broadcast skipped" in text and "# backend deepspeed: all_reduce (path shm)" in text
    assert "# note: deepspeed is deepspeed.comm.inference_all_reduce" in text
    assert "# summary: tuned vs deepspeed" in text


@needs_deepspeed
def test_bench_does_not_time_deepspeed_wrong_results(tmp_path):
    """MAX comes back as the sum from DeepSpeed's shm path: the check counts it and the point is not timed."""
    out = tmp_path / "max.json"
    text = _torchrun("-m", "tunedist.bench", "--backends", "gloo,deepspeed", "--ops", "all_reduce", "-o", "max",
                     "-b", "64", "-e", "64", "-n", "3", "-w", "1", "--rounds", "1", "--memcpy-bytes", "8M",
                     "--no-progress", "--json", str(out), rc=1, timeout=DS_TIMEOUT_S, unset=DS_ENV)
    rows = json.loads(out.read_text())["results"]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows if r["backend"] == "gloo")
    ds = [r for r in rows if r["backend"] == "deepspeed"]
    assert len(ds) == 2 and all(r["wrong"] > 0 and r["time_us"] is None and r["not_timed"] for r in ds)
    assert "not timed (wrong results)" in text


def test_bench_times_tuned_op_beside_tuned(tmp_path):
    """tuned-op (tunedist's operators on a tuned group of its own) beside tuned: right at every point of its four ops
    (bf16 MAX here), and the ops it lacks are skipped with a note."""
    out = tmp_path / "op.json"
    text = _torchrun("-m", "tunedist.bench", "--backends", "tuned,tuned-op", "--ops", ",".join(OPS) + ",gather", "-d",
                     "bfloat16", "-o", "max", "-b", "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--rounds",
                     str(ROUNDS), "--memcpy-bytes", "8M", "--no-progress", "--json", str(out))
    data = json.loads(out.read_text())
    op = [r for r in data["results"] if r["backend"] == "tuned-op"]
    assert {r["op"] for r in op} == set(OPS) and len(op) == 7 * 3  # 7 variants x 3 sizes (broadcast in place only)
    for r in op:
        assert r["dtype"] == "bfloat16" and r["wrong"] == 0 and r["path"] == "op" and r["time_us"] > 0, r
    reason = "tuned-op has all_reduce, all_gather, reduce_scatter, broadcast only"
    assert data["skipped"] == [{"backend": "tuned-op", "op": "gather", "reason": reason}]
    assert {s["backend"] for s in data["summary"]} == {"tuned-op"}
    assert "# backend tuned-op: all_reduce (path op)" in text and "# summary: tuned vs tuned-op" in text


@needs_deepspeed
def test_bench_times_deepspeed_kernel_without_its_api(tmp_path):
    """deepspeed-op (DeepSpeed's kernel, no Python API) beside tuned-op: float32 SUM right on both; MAX comes back
    as the sum from the kernel, is counted wrong and not timed."""
    rows = {}
    for redop, rc in (("sum", 0), ("max", 1)):
        out = tmp_path / f"{redop}.json"
        _torchrun("-m", "tunedist.bench", "--backends", "tuned-op,deepspeed-op", "--ops", "all_reduce", "-o", redop,
                  "-b", "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1", "--rounds", "1", "--memcpy-bytes", "8M",
                  "--no-progress", "--json", str(out), rc=rc, timeout=DS_TIMEOUT_S, unset=DS_ENV)
        rows[redop] = json.loads(out.read_text())["results"]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows["sum"] + rows["max"] if r["backend"] == "tuned-op")
    ds = {k: [r for r in v if r["backend"] == "deepspeed-op"] for k, v in rows.items()}
    assert len(ds["sum"]) == 6 and all(r["wrong"] == 0 and r["path"] == "shm" and r["time_us"] > 0 for r in ds["sum"])
    assert len(ds["max"]) == 6 and all(r["wrong"] > 0 and r["time_us"] is None for r in ds["max"])


def test_call_budget_splits_both_paths(tmp_path):
    """benchmarks/bench_call_budget.py: every row checked (inside the script), and both budgets add up to their
    totals (dist.all_reduce over the c10d floor, tunedist.all_reduce over the operator floor)."""
    out = tmp_path / "budget.json"
    text = _torchrun("benchmarks/bench_call_budget.py", "--sizes", "4K,64K", "--rounds", "1", "--no-gloo",
                     "--no-deepspeed", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [4096, 65536]
    for r in rows:
        assert {"fake", "tuned_ws1", "tuned", "op_floor", "tuned_op_ws1", "tuned_op"} <= set(r["median_us"]), r
        for key, floor in (("budget_us", "fake"), ("op_budget_us", "op_floor")):
            b = r[key]
            assert b["floor"] == r["median_us"][floor] > 0, (key, b)
            # the world-size-1 row includes the engine's self-copy, which synchronisation gives back
            parts = b["floor"] + b["tunedist_per_call"] + b["bytes"] + b["synchronisation"]
            self_copy = r["kernels_us"]["ws1_self_copy"]
            assert b["synchronisation"] == 0 or abs(parts - self_copy - b["total"]) < 1e-6, (key, b, self_copy)
    assert "budget of tuned_op (tunedist.all_reduce), µs: operator floor" in text


def test_main_job_trains_both_runs_and_saves_its_record(tmp_path):
    """The README's first command, shrunk: gloo + default DDP beside tuned + tuner + hook in one torchrun."""
    out, plot = tmp_path / "main_job.json", tmp_path / "main_job.png"
    text = _torchrun("examples/train_ddp.py", "--steps", "4", "--warmup-steps", "1", "--no-sync-steps", "1",
                     "--batch-size", "2", "--seq-len", "8", "--vocab", "64", "--d-model", "32", "--layers", "1",
                     "--heads", "2", "--hook", "fp16", "--json", str(out), "--plot", str(plot))
    record = json.loads(out.read_text())
    assert record["world_size"] == 2 and record["device"] == "cpu"
    base, ours = record["runs"]
    assert (base["backend"], base["hook"]) == ("gloo", None)
    assert (ours["backend"], ours["hook"]) == ("tuned", "fp16") and ours["choice"]
    for run in (base, ours):
        assert run["samples_per_s"] > 0 and run["mean_step_ms"] > 0 and run["exposed_comm_ms"] >= 0
        assert len(run["losses"]) == 4 and all(math.isfinite(x) for x in run["losses"])
    # Same model, data and seeds: only fp16 rounding of the averaged gradients separates the two runs.
    assert base["losses"][0] == ours["losses"][0]
    assert abs(base["final_loss"] - ours["final_loss"]) < 1e-2 * abs(base["final_loss"]), (base, ours)
    assert record["tune"]["rows"] and plot.stat().st_size > 10_000
    assert "tuned / gloo:" in text and "samples/s" in text


def test_fsdp_symmetric_benchmark_runs_zero_copy_with_equal_losses(tmp_path):
    """benchmarks/bench_fsdp_symmetric.py, shrunk: FSDP2 with the group's allocator and zero-copy forced
    (TUNEDIST_SYMMETRIC_MIN_BYTES=0; by default the group measures each class first) runs every all-gather and
    reduce-scatter zero-copy (3 per layer and step: forward and backward all-gather, reduce-scatter), the plain
    configuration none, and both train to the same losses; the memory children report their heap."""
    out = tmp_path / "fsdp_sym.json"
    text = _torchrun("benchmarks/bench_fsdp_symmetric.py", "--layers", "2", "--dim", "512", "--warmup", "1",
                     "--rounds", "2", "--steps", "1", "--mem-steps", "1", "--json", str(out),
                     extra_env={"TUNEDIST_SYMMETRIC_MIN_BYTES": "0"})
    data = json.loads(out.read_text())
    plain, sym = data["time"]["plain"], data["time"]["symmetric"]
    assert plain["zero_copy_ops"] == 0 and sym["zero_copy_ops_per_step"] == 3 * 2 and sym["copy_restarts"] == 0
    assert data["losses"]["equal"] and data["losses"]["max_abs_diff"] == 0 and data["losses"]["steps_compared"] == 3
    assert data["memory_losses_equal"] and len(data["memory"]["symmetric"]["per_rank"]) == 2
    assert data["memory"]["symmetric"]["heap_peak_in_use"] > 0 and data["memory"]["plain"]["heap_reserved"] == 0
    assert data["memory"]["symmetric"]["zero_copy_ops"] == 3 * 2 * 2  # warm-up + 1 step, 2 layers
    assert "losses: EQUAL" in text and "WARNING" not in text


@pytest.mark.parametrize("symmetric,fresh", [(False, False), (True, True)], ids=["plain_floor", "symmetric_fresh"])
def test_ab_builds_benchmark_checks_and_compares(tmp_path, symmetric, fresh):
    """benchmarks/bench_ab_builds.py, shrunk: every point is checked against its closed form (a wrong result fails
    the run) and timed; --compare of a run against itself gives ratio 1 at every point. The plain run also times
    each point's floor (a local stand-in, its result checked too), and --compare sets 2x against it."""
    out = tmp_path / "ab.json"
    floor = not symmetric
    _torchrun("benchmarks/bench_ab_builds.py", "--sizes", "64K,1M", "--rounds", "1", "--json", str(out),
              *(["--symmetric"] if symmetric else []), *(["--fresh"] if fresh else []), *(["--floor"] if floor else []))
    data = json.loads(out.read_text())
    assert data["symmetric"] is symmetric and data["fresh"] is fresh and data["world_size"] == 2
    ops = ("all_gather oop", "all_gather ip", "reduce_scatter oop", "broadcast")
    keys = [f"{op} {n}" for op in ops for n in (65536, 1 << 20)]
    assert sorted(data["points"]) == sorted(keys + [f"floor {k}" for k in keys if floor])
    assert all(p["p50_us"] > 0 and len(p["rounds_us"]) == 1 for p in data["points"].values())
    proc = subprocess.run([sys.executable, "benchmarks/bench_ab_builds.py", "--compare", str(out), str(out)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
    rows = [line for line in proc.stdout.splitlines() if "A/B" in line and not line.startswith("#")]
    assert len(rows) == 8 and all("A/B  1.00" in line for line in rows), proc.stdout
    floor_rows = [line.split() for line in proc.stdout.splitlines() if " A/2 " in line and not line.startswith("#")]
    assert len(floor_rows) == (8 if floor else 0), proc.stdout
    for row in floor_rows:  # "<op words> <bytes> F f A/2 h B/F r F range [..] verdict"
        f, half = float(row[row.index("F") + 1]), float(row[row.index("A/2") + 1])
        # F and A/2 are printed to 0.1 us and the verdict comes from the unrounded values: where the printed ones are
        # within that rounding of each other, either verdict is right.
        if abs(half - f) > 0.1:
            assert ("under F" in " ".join(row)) == (half < f), row
        # At a few us the same rounding alone moves their ratio by a few percent.
        rounding = 0.05 / f + 0.05 / half
        assert float(row[row.index("B/F") + 1]) == pytest.approx(2 * half / f, rel=0.01 + rounding, abs=0.01), row


def test_settings_benchmark_applies_each_setting_and_pairs_the_rounds(tmp_path):
    """benchmarks/bench_settings.py, shrunk: two tuned groups, one with 8 KiB slots (the reserved shared memory
    shows the setting took effect), every op checked and timed; each ratio is the round's time over the baseline's."""
    out = tmp_path / "settings.json"
    ops = OPS + list(MORE_COLLECTIVES)  # tunedist.bench's ops and the other nccl-tests ones
    text = _torchrun("benchmarks/bench_settings.py", "--ops", ",".join(ops), "--sizes", "4K,64K", "--rounds", "3",
                     "--target-s", "0.002", "--min-iters", "8", "--setting", "base:", "--setting",
                     "small:TUNEDIST_SLOT_BYTES=8192,TUNEDIST_SLOT_STORES=streaming", "--json", str(out))
    data = json.loads(out.read_text())
    small_env = {"TUNEDIST_SLOT_BYTES": "8192", "TUNEDIST_SLOT_STORES": "streaming"}
    assert data["settings"] == {"base": {}, "small": small_env}
    shm = data["reserved_shm_bytes"]
    assert 0 < shm["small"] < shm["base"], shm
    assert [(r["op"], r["bytes"]) for r in data["results"]] == [(op, n) for op in ops for n in (4096, 65536)]
    for r in data["results"]:
        base, small = r["settings"]["base"], r["settings"]["small"]
        assert len(base["round_time_us"]) == len(small["round_time_us"]) == 3 and min(base["round_time_us"]) > 0
        assert base["ratio_median"] == base["ratio_min"] == base["ratio_max"] == 1.0
        want = [t / b for t, b in zip(small["round_time_us"], base["round_time_us"])]
        assert small["ratio_median"] == pytest.approx(statistics.median(want))
        assert (small["ratio_min"], small["ratio_max"]) == pytest.approx((min(want), max(want)))
        assert f"{r['op']:>15} {r['bytes']:>10}" in text
    # The auto group's operations (all_reduce, one-shot at these sizes, and the seven others) timed both store modes
    # on every rank (at 64 KiB: under 8 KiB nothing is timed); the group forced to streaming ran no chooser. The
    # chooser's first window closes after kWarmOps + kWindowOps + 1 = 21 operations of a size class: 3 rounds of at
    # least 1 + 8 calls give 27 however slow the host (a CI run once timed 3 calls a round and closed no all_reduce
    # window).
    assert len(data["slot_stores"]) == 2
    for per_rank in data["slot_stores"]:
        assert per_rank["small"]["mode"] == "streaming" and per_rank["small"]["round_chooser"] == []
        assert per_rank["base"]["mode"] == "auto"
        timed = {r["op"] for r in per_rank["base"]["round_chooser"]
                 if r["windows"] >= 1 and r["cached_ns_per_byte"] > 0 and r["streaming_ns_per_byte"] > 0}
        assert timed == set(ops), per_rank["base"]
    assert "# base: last slot-store picks per rank: " in text


@pytest.mark.parametrize("setting", ["nocolon", ":TUNEDIST_SLOT_BYTES=8192", "x:SLOT_BYTES=8192", "x:TUNEDIST_A"])
def test_settings_benchmark_rejects_bad_settings(setting):
    proc = subprocess.run([sys.executable, "benchmarks/bench_settings.py", "--setting", "a:", "--setting", setting],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2 and "bad setting" in proc.stdout, proc.stdout


def test_copy_gbps_copies_and_refuses_bad_buffers():
    src, dst = torch.arange(1 << 16, dtype=torch.int32), torch.zeros(1 << 16, dtype=torch.int32)
    assert tunedist._C.copy_gbps(dst, src) > 0 and torch.equal(dst, src)
    for bad_dst, bad_src, words in ((torch.zeros(8), torch.zeros(9), "same, non-zero size"),
                                    (torch.zeros(0), torch.zeros(0), "same, non-zero size"),
                                    (torch.zeros(8, 8).t(), torch.zeros(8, 8), "contiguous CPU"),
                                    (src, src, "share storage")):
        with pytest.raises(RuntimeError, match=words):
            tunedist._C.copy_gbps(bad_dst, bad_src)
