"""The main job (examples/main_job/run.py, what `./dev main` runs), shrunk with --quick: every workload's runs produce
equal results, and the JSON record, the table and the figure have what they promise. Nothing here checks a time."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "main_job"
PARTS = ("total", "compute", "comm", "optimizer")
STATS = ("median", "p10", "p90", "p99", "n")


def _torchrun(*argv):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(JOB / "run.py"),
           *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module")
def quick_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("main_job")
    rc, text = _torchrun("--quick", "--deepspeed", "off", "--json", str(out / "main_job.json"), "--plot",
                         str(out / "main_job.png"))
    assert rc == 0, text[-8000:]
    return json.loads((out / "main_job.json").read_text()), text, out / "main_job.png"


def _check_breakdown(run: dict, samples: int) -> None:
    b = run["breakdown_ms"]
    for part in PARTS:
        assert set(STATS) <= set(b[part]), (run["name"], part, b[part])
        assert b[part]["n"] == samples, (run["name"], part, b[part]["n"], samples)
        assert b[part]["p10"] <= b[part]["median"] <= b[part]["p90"], (run["name"], part, b[part])
    assert b["total"]["median"] > 0 and b["compute"]["median"] > 0
    crit = run["samples_ms"]
    for t, c, m, o in zip(crit["total_ms"], crit["compute_ms"], crit["comm_ms"], crit["optimizer_ms"]):
        assert abs(t - c - m - o) < 1e-9 * max(1.0, t), (run["name"], t, c, m, o)


def test_every_workload_ran_with_equal_results(quick_job):
    record, _, _ = quick_job
    assert list(record["workloads"]) == ["ddp", "fsdp2", "tp_decode"]
    for name, w in record["workloads"].items():
        assert w["check"]["matched"] is True, (name, w["check"])
        assert w["runs"][0]["role"] == "baseline" and any(r["role"] == "tunedist" for r in w["runs"]), name


def test_ddp_record(quick_job):
    w = quick_job[0]["workloads"]["ddp"]
    base, ours = w["runs"]
    assert (base["backend"], base["hook"], ours["backend"]) == ("gloo", None, "tuned")
    assert ours["choice"] and ours["hook"] in ("allreduce", "fp16", "bf16", "powersgd")
    assert len(base["losses"]) == len(ours["losses"]) == w["steps"] == 4
    assert base["losses"][0] == ours["losses"][0]  # same weights and batch before any gradient was exchanged
    assert w["check"]["exact"] == (ours["hook"] == "allreduce")
    for run in (base, ours):
        _check_breakdown(run, samples=3)
        assert run["samples_per_s"] > 0 and run["breakdown_ms"]["optimizer"]["median"] > 0
    assert w["tune"]["rows"]


def test_fsdp2_record(quick_job):
    w = quick_job[0]["workloads"]["fsdp2"]
    base, ours = w["runs"]
    assert (base["backend"], base["symmetric_buffers"], ours["backend"], ours["symmetric_buffers"]) == (
        "gloo", False, "tuned", True)
    assert base["losses"] == ours["losses"] and len(base["losses"]) == 4 and w["check"]["max_abs_diff"] == 0
    assert w["zero_copy_ops"] > 0  # the symmetric buffers did run zero-copy
    for run in (base, ours):
        _check_breakdown(run, samples=3)
        mem = run["memory_bytes"]
        assert mem["peak"] == mem["state"] + mem["step_peak_growth"] + mem["comm_held"] and mem["state"] > 0
    assert base["memory_bytes"]["comm_held"] == 0 and ours["memory_bytes"]["heap_reserved"] > 0
    assert w["model"]["mixed_precision"] == {"param_dtype": "bfloat16", "reduce_dtype": "float32"}


def test_tp_decode_record(quick_job):
    w = quick_job[0]["workloads"]["tp_decode"]
    names = [r["name"] for r in w["runs"]]
    assert names == ["gloo", "tuned dist.all_reduce", "tunedist.all_reduce"]
    assert w["deepspeed"]["used"] is False and w["deepspeed"]["reason"] == "--deepspeed off"
    generated = {tuple(r["generated"]) for r in w["runs"]}
    assert len(generated) == 1 and len(next(iter(generated))) == w["tokens_per_generation"] == 5
    for run in w["runs"]:
        _check_breakdown(run, samples=w["rounds"] * (w["tokens_per_generation"] - 1))
        assert run["tokens_per_s"] > 0 and run["breakdown_ms"]["optimizer"]["median"] == 0
    assert w["model"]["all_reduces_per_token"] == w["model"]["layers"]


def test_table_json_and_figure(quick_job):
    record, text, png = quick_job
    rows = record["table"]
    assert [r["workload"] for r in rows] == ["DDP"] * 2 + ["FSDP2"] * 2 + ["TP decode"] * 4
    for r in rows:
        assert {"what", "metric", "baseline", "tunedist", "gain", "matched"} <= set(r) and r["gain"] > 0, r
        assert r["matched"] is True and r["baseline_text"] in text and r["tunedist_text"] in text, r
    assert "baseline -> tunedist" in text and "DeepSpeed not measured (--deepspeed off); to add it" in text
    assert record["machine"]["vcpus"] and record["load"]["start"] and record["figure"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_percentiles_and_the_table_marks_a_mismatch():
    sys.path[:0] = [str(JOB), str(JOB.parent)]
    try:
        import common
        import report
    finally:
        del sys.path[:2]
    s = common.spread([float(x) for x in range(1, 11)])
    assert (s["median"], s["p10"], s["p90"], s["n"]) == (5.5, 1.9, 9.1, 10)
    row = report._row("DDP", "a -> b", "samples/s", 1.0, 2.0, "1.0", "2.0", 2.0, False)
    record = {"table": [row], "machine": {"vcpus": 2, "cpu": "x"}, "world_size": 2, "threads_per_rank": 1,
              "load": {"start": [0.0, 0.0, 0.0]}, "workloads": {}}
    last = report.table(record).splitlines()[3]
    assert last.split()[-1] == "NO" and "2.00x" in last


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_tp_decode_with_deepspeed(tmp_path):
    """Where DeepSpeed is installed, its inference_all_reduce is a fourth contender: its shared-memory kernel runs
    (no fallback to torch.distributed) and it generates the same tokens as the others."""
    out = tmp_path / "tp.json"
    rc, text = _torchrun("--quick", "--workloads", "tp_decode", "--deepspeed", "on", "--json", str(out))
    assert rc == 0, text[-8000:]
    w = json.loads(out.read_text())["workloads"]["tp_decode"]
    assert [r["name"] for r in w["runs"]][-1] == "DeepSpeed" and w["check"]["matched"] is True
    assert w["deepspeed"]["kernel_calls"] > 0 and w["deepspeed"]["fallback_calls"] == 0, w["deepspeed"]
    assert len({tuple(r["generated"]) for r in w["runs"]}) == 1
    assert "DeepSpeed -> tunedist.all_reduce" in text
