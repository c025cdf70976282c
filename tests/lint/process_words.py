"""Fails on words of the development process in the project's files: numbered rounds of work ("session 24",
round-numbered folders such as s27/), issue numbers, "filing", "campaign", "moonshot" and the machine named as
"the dev VM". A comment, doc or test states the fact, the reason and the figure; a measurement is cited by topic
(docs/performance.md#<section>) and its machine is named as a machine ("a 2-vCPU AMD EPYC").

    python tests/lint/process_words.py            # every file git knows (tracked, or new and not ignored)
    python tests/lint/process_words.py FILE...    # only these

Prints path:line: rule: text for each hit and exits 1 if there is any. Checked: each file's path and every line
of its text, except under docs/records/ (measurement records, whose raw logs are kept as they were written) and
this file, which holds the patterns.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# (rule, pattern), case-insensitive. Each pattern is written so that ordinary code does not match it: `s1`, `s22`
# and `len(s1)` stay legal; "s<digits>/" (a round-numbered folder), "(s18)" after a space, "s19's" and "s11 and s12"
# count. An issue reference is "#" and digits after a space or bracket, not a colour such as "#1f77b4".
RULES: list[tuple[str, re.Pattern[str]]] = [
    (rule, re.compile(pattern, re.IGNORECASE))
    for rule, pattern in [
        ("a numbered session of work", r"\bsessions?[ _-]?#?[0-9]+"),
        ("a round-numbered folder (s<N>/)", r"(?<![A-Za-z0-9_.])s[0-9]{1,3}(?:_[a-z0-9]+)*/"),
        ("a round number (s<N>)",
         r"(?<![A-Za-z0-9_.])s[0-9]{1,3}(?:'s\b|,? (?:and|or|to) s[0-9])|(?:^|\s)\(s[0-9]{1,3}\)"),
        ("an issue number", r"\bissues?[ _-]?(?:#|no\.? ?)?[0-9]+\b"),
        ("an issue reference (#N)", r"(?:^|[\s(\[])#[0-9]{1,5}\b(?![0-9a-f])"),
        ("'filing'", r"\bfiling"),
        ("'campaign'", r"campaign"),
        ("'moonshot'", r"moonshot"),
        ("the machine as 'the dev VM'",
         r"\b(?:dev|development|this|our|the project's|this project's)(?: [0-9]+-vCPU)? VM\b"),
    ]
]

# Lines each rule must catch, and lines of ordinary code and prose no rule may catch (tests/python/test_lint.py).
CAUGHT = [
    "Until session 24 only single-round operations were chosen this way.",
    "measured in docs/records/issue14/s21/dual_store_copy.txt",
    "see s19_chunk8m/ for the variant",
    "in a broadcast that alone decided (s19), as before",
    "s19's table and s20's",
    "A stopped rank is a slow rank (issue #13).",
    "Symmetric CPU buffers (issue 15) in real processes",
    "fixed in #42",
    "the filing commit",
    "the latest campaign, five jobs",
    "a moonshot target",
    "Measured on the dev VM (2 vCPUs of an AMD EPYC)",
    "on this project's 2-vCPU VM",
]
PASSED = [
    "s11, s12, s22 = sum(a * a for a in u1), 0.0, 0.0",
    "Waiter s1, s2; e.isend(1, 1, a.data(), n1, deadline, s1.done());",
    "alpha = (r1 * s22 - r2 * s12) / det; n = len(s1)",
    "round 0: every rank writes the sizes; rounds 1..R copy",
    'color="#1f77b4"; # 1. the first step',
    "start_new_session=True  # a session of its own",
    "Measured on a 2-vCPU AMD EPYC (docs/performance.md#store-placement-cached-or-streaming); a cloud VM moves vCPUs",
    "profiling, filling, filter, compile",
]

EXCLUDED_DIRS = ("docs/records/",)
SELF = "tests/lint/process_words.py"


def known_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def checked(path: str) -> bool:
    return path != SELF and not path.startswith(EXCLUDED_DIRS)


def hits_in_line(text: str) -> list[str]:
    return [rule for rule, pattern in RULES if pattern.search(text)]


def check_file(root: Path, path: str) -> list[str]:
    out = [f"{path}: {rule} in the file's path" for rule in hits_in_line(path)]
    full = root / path
    if not full.is_file():
        return out
    data = full.read_bytes()
    if b"\0" in data[:8192]:
        return out  # binary
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        for rule in hits_in_line(line):
            out.append(f"{path}:{number}: {rule}: {line.strip()[:160]}")
    return out


def main(argv: list[str]) -> int:
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                               text=True).stdout.strip())
    paths = [str(Path(p).resolve().relative_to(root)) for p in argv] if argv else known_files(root)
    problems = [hit for path in paths if checked(path) for hit in check_file(root, path)]
    for line in problems:
        print(line)
    if problems:
        print(f"process words: {len(problems)} hit(s). State the fact, the reason and the figure; cite a measurement "
              "by topic (docs/performance.md#<section>) and name the machine as a machine. Patterns: " + SELF,
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
