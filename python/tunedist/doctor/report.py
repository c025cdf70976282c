"""The doctor's report: findings (check, verdict, evidence, fix) plus the measurements behind them, as a table."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import asdict, dataclass, field

from ..nccl_env import VERDICTS, Finding

SKIPPED = "skipped: "  # evidence prefix of a check that does not apply here (verdict ok)


def skipped(check: str, why: str) -> Finding:
    """An ok Finding that says honestly that the check did not run, and why (e.g. "no GPU")."""
    return Finding(check, "ok", SKIPPED + why)


@dataclass
class Report:
    findings: list[Finding]
    measurements: dict[str, float] = field(default_factory=dict)

    def by_check(self) -> dict[str, Finding]:
        return {f.check: f for f in self.findings}

    def __getitem__(self, check: str) -> Finding:
        found = self.by_check()
        if check not in found:
            raise KeyError(f"Report: no check named {check!r}; checks: {', '.join(found)}")
        return found[check]

    @property
    def worst(self) -> str:
        return max((f.verdict for f in self.findings), key=VERDICTS.index, default="ok")

    @property
    def failed(self) -> bool:
        return self.worst == "fail"

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict != "ok"]

    def to_json(self) -> str:
        return json.dumps({"findings": [asdict(f) for f in self.findings], "measurements": self.measurements},
                          indent=1)

    def table(self, width: int | None = None) -> str:
        return format_table(self.findings, width)


def format_table(findings: list[Finding], width: int | None = None) -> str:
    """Four columns (check, verdict, evidence, fix); evidence and fix wrap within the terminal width."""
    width = width or max(100, shutil.get_terminal_size((140, 24)).columns)
    check_w = max([len("check")] + [len(f.check) for f in findings])
    verdict_w = len("verdict")
    text_w = max(20, (width - check_w - verdict_w - 6) // 2)
    rows = [("check", "verdict", "evidence", "fix"), ("-" * check_w, "-" * verdict_w, "-" * text_w, "-" * text_w)]
    lines = []
    for check, verdict, evidence, fix in rows:
        lines.append(f"{check:<{check_w}}  {verdict:<{verdict_w}}  {evidence:<{text_w}}  {fix}".rstrip())
    for f in findings:
        ev = textwrap.wrap(f.evidence, text_w) or [""]
        fx = textwrap.wrap(f.fix, text_w) or [""]
        for i in range(max(len(ev), len(fx))):
            first = i == 0
            e = ev[i] if i < len(ev) else ""
            x = fx[i] if i < len(fx) else ""
            lines.append(f"{f.check if first else '':<{check_w}}  {f.verdict.upper() if first else '':<{verdict_w}}  "
                         f"{e:<{text_w}}  {x}".rstrip())
    counts = {v: sum(f.verdict == v for f in findings) for v in VERDICTS}
    lines.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")
    return "\n".join(lines)
