"""What NCCL and gloo will use, as far as the environment and the machine tell, and the settings that hurt.

    from tunedist.nccl_env import nccl_findings, nccl_summary
    print(nccl_summary())                      # "NCCL network: sockets on eth0 (...) | ..."
    for f in nccl_findings(): print(f.check, f.verdict, f.evidence, f.fix)

Shared by ``python -m tunedist.doctor`` and the backend's CUDA set-up (which logs the summary when it creates the
NCCL side). Nothing here sets or changes the environment: every function reads the mapping it is given
(``os.environ`` when None) and the machine through a :class:`MachineProbe`, which tests replace.

Checks (one :class:`Finding` each, verdict ``ok``, ``warn`` or ``fail``):

- ``nccl.async_error_handling``: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (or the deprecated name set to 0 with the
  new one unset) turns off torch's handling of asynchronous NCCL errors: a failed or timed-out collective leaves
  the ranks hanging instead of raising. warn.
- ``nccl.deprecated_names``: ``NCCL_ASYNC_ERROR_HANDLING`` is the deprecated spelling of
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING``. warn.
- ``nccl.infiniband``: InfiniBand/RoCE devices under ``/sys/class/infiniband`` but ``NCCL_IB_DISABLE=1``: NCCL
  falls back to TCP sockets. warn.
- ``nccl.socket_ifname``: ``NCCL_SOCKET_IFNAME`` with NCCL's syntax: a comma list of name prefixes; a leading
  ``^`` excludes the listed ones instead, and a leading ``=`` (after any ``^``) makes the names exact. fail when
  the setting leaves no existing interface; warn when some listed names match none.
- ``gloo.socket_ifname``: ``GLOO_SOCKET_IFNAME`` is a comma list of exact interface names (gloo opens one device per
  name); fail when one does not exist.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

VERDICTS = ("ok", "warn", "fail")

ASYNC_NAME = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ASYNC_DEPRECATED_NAME = "NCCL_ASYNC_ERROR_HANDLING"
IB_SYS_DIR = Path("/sys/class/infiniband")


@dataclass
class Finding:
    """One check's outcome: what was checked, the verdict, what it saw, and what to do (empty when ok)."""

    check: str
    verdict: str  # "ok" | "warn" | "fail"
    evidence: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Finding {self.check!r}: verdict must be one of {VERDICTS}, got {self.verdict!r}")


def _system_interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


@dataclass(frozen=True)
class IbDevice:
    name: str
    ports: tuple[str, ...]  # "1: ACTIVE (InfiniBand)", ... as far as sysfs tells

    @property
    def active(self) -> bool:
        """True when a port is ACTIVE, or when sysfs shows no port states (then assume it is usable)."""
        return not self.ports or any("ACTIVE" in p for p in self.ports)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class MachineProbe:
    """How the checks see the machine: the InfiniBand sysfs directory and the network interface names."""

    ib_dir: Path = IB_SYS_DIR
    interfaces: Callable[[], list[str]] = field(default=_system_interfaces)

    def ib_devices(self) -> list[IbDevice]:
        try:
            names = sorted(p.name for p in self.ib_dir.iterdir())
        except OSError:  # no such directory: no RDMA devices (or no sysfs)
            return []
        return [IbDevice(name, self._ports(self.ib_dir / name / "ports")) for name in names]

    @staticmethod
    def _ports(ports_dir: Path) -> tuple[str, ...]:
        try:
            ports = sorted(p for p in ports_dir.iterdir())
        except OSError:
            return ()
        out = []
        for port in ports:
            state = _read(port / "state")  # e.g. "4: ACTIVE"
            layer = _read(port / "link_layer")  # "InfiniBand" or "Ethernet" (RoCE)
            label = f"{port.name}: {state.split(':', 1)[-1].strip() or '?'}"
            out.append(f"{label} ({layer})" if layer else label)
        return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# NCCL_SOCKET_IFNAME syntax


@dataclass(frozen=True)
class IfnameSpec:
    """A parsed NCCL_SOCKET_IFNAME: ``[^][=]name[,name...]``."""

    exclude: bool
    exact: bool
    names: tuple[str, ...]

    @classmethod
    def parse(cls, value: str) -> IfnameSpec:
        text = value.strip()
        exclude = text.startswith("^")
        text = text[1:] if exclude else text
        exact = text.startswith("=")
        text = text[1:] if exact else text
        return cls(exclude, exact, tuple(n.strip() for n in text.split(",") if n.strip()))

    def matches(self, name: str, entry: str) -> bool:
        return name == entry if self.exact else name.startswith(entry)

    def unmatched(self, interfaces: list[str]) -> list[str]:
        """The listed names that match no existing interface."""
        return [e for e in self.names if not any(self.matches(i, e) for i in interfaces)]

    def selected(self, interfaces: list[str]) -> list[str]:
        """The interfaces NCCL may use under this setting."""
        hit = [i for i in interfaces if any(self.matches(i, e) for e in self.names)]
        return [i for i in interfaces if i not in hit] if self.exclude else hit


def _nccl_default_interfaces(interfaces: list[str]) -> list[str]:
    """NCCL's choice without NCCL_SOCKET_IFNAME: ib* first, else anything but docker* and lo, else lo."""
    ib = [i for i in interfaces if i.startswith("ib")]
    if ib:
        return ib
    rest = [i for i in interfaces if not i.startswith(("docker", "lo"))]
    return rest or [i for i in interfaces if i.startswith("lo")]


# ---------------------------------------------------------------------------------------------------------------
# The checks


def _is_set(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip() != ""


def _check_async_error_handling(env: Mapping[str, str]) -> Finding:
    check = "nccl.async_error_handling"
    name = ASYNC_NAME if _is_set(env, ASYNC_NAME) else ASYNC_DEPRECATED_NAME
    if not _is_set(env, name):
        return Finding(check, "ok", f"{ASYNC_NAME} unset: torch's default error handling applies")
    value = env[name].strip()
    if value == "0":
        return Finding(check, "warn",
                       f"{name}=0: asynchronous NCCL errors and timeouts are not handled, so a failed collective "
                       "leaves every rank hanging instead of raising",
                       f"unset {name} (or set {ASYNC_NAME}=1 to tear down the process on an NCCL error)")
    return Finding(check, "ok", f"{name}={value}")


def _check_deprecated_names(env: Mapping[str, str]) -> Finding:
    check = "nccl.deprecated_names"
    if ASYNC_DEPRECATED_NAME not in env:
        return Finding(check, "ok", f"{ASYNC_DEPRECATED_NAME} unset")
    old = env[ASYNC_DEPRECATED_NAME]
    if ASYNC_NAME in env:
        evidence = (f"{ASYNC_DEPRECATED_NAME}={old} is the deprecated name; torch reads {ASYNC_NAME}="
                    f"{env[ASYNC_NAME]} instead and ignores it")
        fix = f"remove {ASYNC_DEPRECATED_NAME}"
    else:
        evidence = f"{ASYNC_DEPRECATED_NAME}={old} is the deprecated name of {ASYNC_NAME}"
        fix = f"rename it: {ASYNC_NAME}={old}"
    return Finding(check, "warn", evidence, fix)


def _check_infiniband(env: Mapping[str, str], probe: MachineProbe) -> Finding:
    check = "nccl.infiniband"
    active = [d for d in probe.ib_devices() if d.active]
    if not active:
        return Finding(check, "ok", f"no active InfiniBand/RoCE device under {probe.ib_dir}: NCCL uses sockets "
                       "between hosts")
    names = ", ".join(d.name for d in active)
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return Finding(check, "warn",
                       f"InfiniBand/RoCE devices {names} are present but NCCL_IB_DISABLE=1: NCCL sends inter-host "
                       "traffic over TCP sockets",
                       "unset NCCL_IB_DISABLE (check with NCCL_DEBUG=INFO that NCCL then reports NET/IB)")
    return Finding(check, "ok", f"InfiniBand/RoCE devices {names} present and not disabled")


def _check_nccl_ifname(env: Mapping[str, str], interfaces: list[str]) -> Finding:
    check = "nccl.socket_ifname"
    value = env.get("NCCL_SOCKET_IFNAME", "")
    if not value.strip():
        return Finding(check, "ok", f"NCCL_SOCKET_IFNAME unset: by default NCCL may use "
                       f"{_fmt(_nccl_default_interfaces(interfaces))} (ib* first, then all but docker* and lo)")
    spec = IfnameSpec.parse(value)
    selected = spec.selected(interfaces)
    unmatched = spec.unmatched(interfaces)
    how = "exact names" if spec.exact else "name prefixes"
    if not selected:
        verb = "excludes every interface" if spec.exclude else f"matches no interface ({how})"
        return Finding(check, "fail", f"NCCL_SOCKET_IFNAME={value} {verb}; existing interfaces: {_fmt(interfaces)}",
                       "set NCCL_SOCKET_IFNAME to one of the existing interfaces (e.g. the one that carries the "
                       "hosts' IP addresses), or unset it")
    if unmatched and not spec.exclude:
        return Finding(check, "warn",
                       f"NCCL_SOCKET_IFNAME={value}: {_fmt(unmatched)} match no interface ({how}); NCCL uses "
                       f"{_fmt(selected)}; existing interfaces: {_fmt(interfaces)}",
                       f"drop or correct {_fmt(unmatched)} (a typo here on another host fails there)")
    return Finding(check, "ok", f"NCCL_SOCKET_IFNAME={value}: NCCL may use {_fmt(selected)}")


def _check_gloo_ifname(env: Mapping[str, str], interfaces: list[str]) -> Finding:
    check = "gloo.socket_ifname"
    value = env.get("GLOO_SOCKET_IFNAME", "")
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        return Finding(check, "ok", "GLOO_SOCKET_IFNAME unset: gloo binds to the address the hostname resolves to")
    missing = [n for n in names if n not in interfaces]
    if missing:
        return Finding(check, "fail",
                       f"GLOO_SOCKET_IFNAME={value}: no interface named {_fmt(missing)} (gloo takes exact names, no "
                       f"prefixes or ^); existing interfaces: {_fmt(interfaces)}",
                       "set GLOO_SOCKET_IFNAME to existing interface names, or unset it")
    return Finding(check, "ok", f"GLOO_SOCKET_IFNAME={value}: all named interfaces exist")


def _fmt(names: list[str]) -> str:
    return ", ".join(names) if names else "(none)"


def nccl_findings(env: Mapping[str, str] | None = None, probe: MachineProbe | None = None) -> list[Finding]:
    """Every NCCL/gloo environment check, one Finding each (ok ones too), in a fixed order."""
    env = os.environ if env is None else env
    probe = probe or MachineProbe()
    interfaces = probe.interfaces()
    return [
        _check_async_error_handling(env),
        _check_deprecated_names(env),
        _check_infiniband(env, probe),
        _check_nccl_ifname(env, interfaces),
        _check_gloo_ifname(env, interfaces),
    ]


def _network_line(env: Mapping[str, str], probe: MachineProbe, interfaces: list[str]) -> str:
    devices = probe.ib_devices()
    active = [d for d in devices if d.active]
    ib_off = env.get("NCCL_IB_DISABLE", "").strip() == "1"
    forced = env.get("NCCL_NET", "").strip()
    value = env.get("NCCL_SOCKET_IFNAME", "")
    socks = IfnameSpec.parse(value).selected(interfaces) if value.strip() else _nccl_default_interfaces(interfaces)
    sockets = f"sockets on {_fmt(socks)}"
    if forced:
        return f"NCCL network: NCCL_NET={forced} forces that transport ({sockets} if Socket)"
    if active and not ib_off:
        hca = env.get("NCCL_IB_HCA", "").strip()
        ports = "; ".join(f"{d.name} [{', '.join(d.ports) or 'ports unknown'}]" for d in active)
        return f"NCCL network: IB/RoCE on {ports}" + (f" filtered by NCCL_IB_HCA={hca}" if hca else "")
    why = "NCCL_IB_DISABLE=1" if active else "no active InfiniBand/RoCE device"
    return f"NCCL network: {sockets} ({why})"


def nccl_summary(env: Mapping[str, str] | None = None, probe: MachineProbe | None = None) -> str:
    """A few lines: the network NCCL will use between hosts, and every NCCL_* setting, as far as can be told."""
    env = os.environ if env is None else env
    probe = probe or MachineProbe()
    interfaces = probe.interfaces()
    lines = [_network_line(env, probe, interfaces)]
    settings = sorted(f"{k}={v}" for k, v in env.items() if k.startswith(("NCCL_", "TORCH_NCCL_")))
    lines.append("NCCL settings: " + (" ".join(settings) if settings else "none (NCCL defaults)"))
    gloo = env.get("GLOO_SOCKET_IFNAME", "").strip()
    lines.append(f"interfaces: {_fmt(interfaces)}" + (f"; GLOO_SOCKET_IFNAME={gloo}" if gloo else ""))
    return "\n".join(lines)
