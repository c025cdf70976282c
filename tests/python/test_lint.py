"""The process-words lint (tests/lint/process_words.py, run by ./dev test): each rule catches the lines it is for,
no rule catches ordinary code, and the check fails on a file with such a line and passes once it is gone."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "lint" / "process_words.py"
_spec = importlib.util.spec_from_file_location("process_words", _SCRIPT)
words = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(words)


@pytest.mark.parametrize("line", words.CAUGHT)
def test_caught(line):
    assert words.hits_in_line(line), line


@pytest.mark.parametrize("line", words.PASSED)
def test_passed(line):
    assert words.hits_in_line(line) == [], line


def test_every_rule_is_exercised():
    used = {rule for line in words.CAUGHT for rule in words.hits_in_line(line)}
    assert used == {rule for rule, _ in words.RULES}


def test_fails_on_a_planted_line_then_passes(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    planted = tmp_path / "notes.md"
    planted.write_text("The fast path.\n" + words.CAUGHT[0] + "\n")
    run = [sys.executable, str(_SCRIPT)]
    failed = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert failed.returncode == 1 and "notes.md:2: a numbered session of work" in failed.stdout, failed
    planted.write_text("The fast path.\n")
    passed = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True)
    assert passed.returncode == 0 and passed.stdout == "", passed
