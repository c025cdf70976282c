"""Smoke test of benchmarks/netns_bench.sh: two network namespaces over a tbf-shaped veth, tiny sizes.

It checks what the benchmark's figures rest on, never a time: tuned spans 2 hosts, every result is right, the
link was shaped and probed, the report runs, and the namespaces are gone afterwards. Needs root and iproute2
(ip netns, tc); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "netns_bench.sh"
# Hang guard, not a performance limit (the run takes 30-40 s on a 2-vCPU AMD EPYC).
GUARD_S = 240


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _netns_usable(), reason="needs root and iproute2 (ip netns, tc)")


def test_netns_bench_smoke(tmp_path):
    env = {**os.environ, "NETNS_PROBE_S": "0.3", "NETNS_WIRE_BYTES": "0"}  # the wire count takes a torchrun more
    cmd = [str(SCRIPT), "1gbit", str(tmp_path), "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--memcpy-bytes", "1M"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.terminate()  # its EXIT trap deletes the namespaces
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"tdnb{proc.pid}" not in left, left

    rec = json.loads((tmp_path / "1gbit_run1.json").read_text())
    assert len(rec["tuned_hosts"]) == 2, rec["tuned_hosts"]
    assert {r["backend"] for r in rec["results"]} == {"tuned", "gloo"}
    assert [r for r in rec["results"] if r["wrong"]] == []
    netns = rec["netns"]
    assert netns["tbf"].startswith("tbf rate 1gbit burst 262144")
    assert all("tbf" in line for line in netns["qdisc_after"]) and len(netns["qdisc_after"]) == 2
    assert [x["bytes"] > 0 for x in netns["line_rate"]["both_at_once"]] == [True, True]

    report = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "netns_report.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert "speedup bound 1.5" in report.stdout, report.stdout
