"""Checks on the documentation: no development-round labels or machine paths in the reference docs,
and every relative markdown link (README.md, docs/**/*.md) resolves to a file and, where it names an
anchor in a markdown file, to a heading of that file. Fast: reads text only."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Reference docs: docs/*.md and docs/adr/*.md. docs/history/ holds dated logs kept for the record, and
# docs/benchmark_results/ holds raw generated run records (commands as they were run), so neither is checked.
LABEL_PATTERNS = [
    re.compile(r"[Ii]ssue [0-9]+"),
    re.compile(r"[Ss]ession [0-9]+"),
    re.compile(r"/tmp/s[0-9]+"),
    re.compile(r"/work/"),
]


def _reference_docs() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + sorted((DOCS / "adr").glob("*.md"))


def _all_markdown() -> list[Path]:
    return [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))


_FENCE = re.compile(r"^\s*(```|~~~)")


def _strip_code(text: str, inline: bool = True) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, with inline code spans removed unless `inline` is false (a
    heading's backticks still shape its anchor); (line number, text)."""
    out: list[tuple[int, str]] = []
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((number, re.sub(r"`[^`]*`", "", line) if inline else line))
    return out


def _slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, underscores, hyphens and spaces
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for _, line in _strip_code(path.read_text(encoding="utf-8"), inline=False):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        # Inline markup does not reach the anchor: drop link targets, emphasis and backticks.
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        title = title.replace("`", "").replace("*", "")
        base = _slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _strip_code(path.read_text(encoding="utf-8")):
        for m in _LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            found.append((number, target))
    return found


@pytest.mark.parametrize("path", _reference_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_round_labels_or_machine_paths(path: Path) -> None:
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for pattern in LABEL_PATTERNS:
            m = pattern.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r}")
    assert not hits, "round labels, issue numbers or machine paths:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", _all_markdown(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for number, target in _links(path):
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        dest = path if not file_part else (path.parent / file_part).resolve()
        if not dest.exists():
            broken.append(f"{path.relative_to(ROOT)}:{number}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and dest.is_file():
            if unquote(anchor).lower() not in _anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_rule() -> None:
    assert _slug("Decode attention: one kernel") == "decode-attention-one-kernel"
    assert _slug("One kernel family: exact across routes") == "one-kernel-family-exact-across-routes"
    assert _slug("The `--itl-budget-ms` flag") == "the---itl-budget-ms-flag"


MAX_DOC_LINES = 600


def test_reference_docs_are_at_most_600_lines() -> None:
    """A reference page over 600 lines is split by subject (docs/history/ and docs/benchmark_results/
    are not reference pages and are not checked)."""
    over = []
    for path in sorted(DOCS.glob("*.md")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_DOC_LINES:
            over.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not over, f"docs over {MAX_DOC_LINES} lines:\n" + "\n".join(over)
