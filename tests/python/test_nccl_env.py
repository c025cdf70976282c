"""tunedist.nccl_env: each NCCL/gloo environment check fires on a setting that has the problem and is ok without.

The machine is seen through MachineProbe: the InfiniBand checks get a sysfs-shaped directory under tmp_path (this
machine has no RDMA device), the interface checks run both on this machine's real interfaces and on a given list.
"""

import os
from pathlib import Path

import pytest

from tunedist.nccl_env import Finding, IfnameSpec, MachineProbe, nccl_findings, nccl_summary

IFACES = ["docker0", "eth0", "eth1", "ib0", "lo"]


def _probe(tmp_path: Path, ib: dict[str, str] | None = None, ifaces=IFACES) -> MachineProbe:
    """A probe over a sysfs-shaped tree: ib maps device name -> port 1 state ("4: ACTIVE", "1: DOWN")."""
    root = tmp_path / "infiniband"
    root.mkdir(parents=True, exist_ok=True)
    for dev, state in (ib or {}).items():
        port = root / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
    return MachineProbe(ib_dir=root, interfaces=lambda: list(ifaces))


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def _one(env, probe, check) -> Finding:
    return _by_check(nccl_findings(env, probe))[check]


def test_clean_environment_is_all_ok(tmp_path):
    findings = nccl_findings({}, _probe(tmp_path))
    assert [f.check for f in findings] == ["nccl.async_error_handling", "nccl.deprecated_names", "nccl.infiniband",
                                           "nccl.socket_ifname", "gloo.socket_ifname"]
    assert all(f.verdict == "ok" and f.fix == "" for f in findings), findings


@pytest.mark.parametrize("env, verdict", [
    pytest.param({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "warn", id="new-name-0"),
    pytest.param({"NCCL_ASYNC_ERROR_HANDLING": "0"}, "warn", id="old-name-0"),
    pytest.param({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "0"}, "ok",
                 id="new-name-wins"),
    pytest.param({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, "ok", id="3"),
])
def test_async_error_handling(tmp_path, env, verdict):
    f = _one(env, _probe(tmp_path), "nccl.async_error_handling")
    assert f.verdict == verdict, f
    if verdict == "warn":
        assert "hang" in f.evidence and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.fix


def test_deprecated_name_names_the_new_one(tmp_path):
    f = _one({"NCCL_ASYNC_ERROR_HANDLING": "1"}, _probe(tmp_path), "nccl.deprecated_names")
    assert f.verdict == "warn" and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in f.fix
    both = _one({"NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, _probe(tmp_path),
                "nccl.deprecated_names")
    assert both.verdict == "warn" and "ignores" in both.evidence
    assert _one({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, _probe(tmp_path), "nccl.deprecated_names").verdict == "ok"


@pytest.mark.parametrize("ib, disable, verdict", [
    pytest.param({"mlx5_0": "4: ACTIVE"}, "1", "warn", id="active-disabled"),
    pytest.param({"mlx5_0": "4: ACTIVE"}, "0", "ok", id="active-enabled"),
    pytest.param({"mlx5_0": "4: ACTIVE"}, None, "ok", id="active-unset"),
    pytest.param({"mlx5_0": "1: DOWN"}, "1", "ok", id="down-disabled"),
    pytest.param({}, "1", "ok", id="none-disabled"),
])
def test_infiniband_disabled(tmp_path, ib, disable, verdict):
    env = {} if disable is None else {"NCCL_IB_DISABLE": disable}
    f = _one(env, _probe(tmp_path, ib), "nccl.infiniband")
    assert f.verdict == verdict, f
    if verdict == "warn":
        assert "mlx5_0" in f.evidence and "NCCL_IB_DISABLE" in f.fix


def test_missing_ib_directory_means_no_devices(tmp_path):
    probe = MachineProbe(ib_dir=tmp_path / "absent", interfaces=lambda: IFACES)
    assert probe.ib_devices() == []
    assert _one({"NCCL_IB_DISABLE": "1"}, probe, "nccl.infiniband").verdict == "ok"


@pytest.mark.parametrize("value, verdict, uses", [
    pytest.param("eth", "ok", ["eth0", "eth1"], id="prefix"),
    pytest.param("=eth0", "ok", ["eth0"], id="exact"),
    pytest.param("=eth", "fail", [], id="exact-is-not-prefix"),
    pytest.param("wlan0", "fail", [], id="missing"),
    pytest.param("eth0,wlan0", "warn", ["eth0"], id="list-one-missing"),
    pytest.param("^docker,lo", "ok", ["eth0", "eth1", "ib0"], id="exclude"),
    pytest.param("^=docker0,lo", "ok", ["eth0", "eth1", "ib0"], id="exclude-exact"),
    pytest.param("^docker,lo,nosuch", "ok", ["eth0", "eth1", "ib0"], id="exclude-unknown-harmless"),
    pytest.param("^e,d,i,l", "fail", [], id="exclude-everything"),
])
def test_nccl_socket_ifname(tmp_path, value, verdict, uses):
    spec = IfnameSpec.parse(value)
    assert spec.selected(IFACES) == uses
    f = _one({"NCCL_SOCKET_IFNAME": value}, _probe(tmp_path), "nccl.socket_ifname")
    assert f.verdict == verdict, f
    if verdict == "fail":
        assert "existing interfaces: docker0, eth0, eth1, ib0, lo" in f.evidence and f.fix
    if verdict == "warn":
        assert "wlan0" in f.evidence and "wlan0" in f.fix


@pytest.mark.parametrize("value, verdict", [
    pytest.param("eth0", "ok", id="exists"),
    pytest.param("eth0,eth1", "ok", id="list"),
    pytest.param("eth", "fail", id="no-prefixes"),
    pytest.param("eth0,wlan0", "fail", id="one-missing"),
])
def test_gloo_socket_ifname(tmp_path, value, verdict):
    f = _one({"GLOO_SOCKET_IFNAME": value}, _probe(tmp_path), "gloo.socket_ifname")
    assert f.verdict == verdict, f
    if verdict == "fail":
        assert "existing interfaces: docker0, eth0" in f.evidence


def test_real_machine_interfaces():
    """On this machine's own interface list (lo always exists; 'nosuch9' never does)."""
    real = MachineProbe()
    assert "lo" in real.interfaces()
    assert _one({"NCCL_SOCKET_IFNAME": "=lo"}, real, "nccl.socket_ifname").verdict == "ok"
    assert _one({"NCCL_SOCKET_IFNAME": "nosuch9"}, real, "nccl.socket_ifname").verdict == "fail"
    assert _one({"GLOO_SOCKET_IFNAME": "lo"}, real, "gloo.socket_ifname").verdict == "ok"
    assert _one({"GLOO_SOCKET_IFNAME": "nosuch9"}, real, "gloo.socket_ifname").verdict == "fail"


def test_summary(tmp_path):
    env = {"NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "=eth1", "PATH": "/bin"}
    text = nccl_summary(env, _probe(tmp_path, {"mlx5_0": "4: ACTIVE"}))
    assert "sockets on eth1 (NCCL_IB_DISABLE=1)" in text
    assert "NCCL_DEBUG=INFO" in text and "PATH" not in text
    on_ib = nccl_summary({}, _probe(tmp_path / "b", {"mlx5_0": "4: ACTIVE"}))
    assert "IB/RoCE on mlx5_0 [1: ACTIVE (InfiniBand)]" in on_ib and "NCCL defaults" in on_ib
    plain = nccl_summary({}, _probe(tmp_path / "c"))
    assert "sockets on ib0" in plain  # NCCL prefers ib* interfaces (IPoIB) by default


def test_reads_os_environ_and_never_writes_it(monkeypatch):
    monkeypatch.setenv("NCCL_ASYNC_ERROR_HANDLING", "0")
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    before = dict(os.environ)
    assert _by_check(nccl_findings())["nccl.deprecated_names"].verdict == "warn"
    nccl_summary()
    assert dict(os.environ) == before


def test_finding_rejects_unknown_verdict():
    with pytest.raises(ValueError, match="verdict"):
        Finding("x", "bad", "evidence")
