"""Every relative link in the project's Markdown files resolves: the file or folder exists, and a #fragment names a
heading of the target (GitHub's anchors: lower case, punctuation dropped, spaces to dashes, -1, -2 for repeats)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for m in LINK.finditer(FENCE.sub("", path.read_text())):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{path}: {target}: no such heading")
    return bad


def test_every_relative_link_in_the_markdown_files_resolves():
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    assert names, "git lists no Markdown file"
    bad = [b for name in names if (ROOT / name).is_file() for b in broken_links(ROOT / name)]
    assert not bad, "\n".join(bad)


def test_a_broken_link_and_a_missing_heading_are_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Large all-reduces: the bound (and more)\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](other.md#large-all-reduces-the-bound-and-more) [b](other.md#nope) [c](gone.md)\n"
                   "```\n[d](inside-a-fence.md)\n```\n")
    bad = broken_links(doc)
    assert len(bad) == 2 and "#nope: no such heading" in bad[0] and "gone.md: no such file" in bad[1], bad
