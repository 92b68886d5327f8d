"""Every citation of a docs page (`docs/<page>.md#<anchor>` in code, help texts and docs; a
relative Markdown link in a .md file) names a page that exists and a heading on it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "node_modules", ".gpu", "reports", "build", "dist", ".mypy_cache"}
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".js", ".html", ".txt"}
CITATION = re.compile(r"(?<![\w/.])docs/([\w./-]+?\.md)(?:#([\w-]+))?")
LINK = re.compile(r"\]\(([^)\s#]*\.md)?(?:#([^)\s]+))?\)")
BY_NAME = re.compile(r"docs/[\w./-]+\.md,?\s*(section\b|\")")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a Markdown page's headings (a repeated one gets -1, -2, …)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def sources() -> list[Path]:
    """The repository's text files that may cite a docs page."""
    files = []
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        named = path.suffix in SUFFIXES or path.name in ("Makefile", "Procfile", "run")
        if named and path.is_file() and not SKIP & set(parts):
            files.append(path)
    return files


def broken(page: Path, anchor: str | None) -> str | None:
    """Why a citation of `page#anchor` points nowhere (None: it is fine)."""
    if not page.is_file():
        return "no such page"
    if anchor is not None and anchor.lower() not in anchors(page):
        return f"no heading #{anchor}"
    return None


def citations(path: Path) -> list[tuple[int, str, Path, str | None]]:
    """(line, as written, page, anchor) of each docs citation in a file."""
    found = []
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        for match in CITATION.finditer(line):
            page = REPO / "docs" / match.group(1)
            found.append((number, match.group(0), page, match.group(2)))
        if path.suffix != ".md":
            continue
        for match in LINK.finditer(line):
            target, anchor = match.group(1), match.group(2)
            if target is not None and re.match(r"^[a-z]+:", target):
                continue  # a URL, not a page of the repository
            page = path if target is None else (path.parent / target).resolve()
            found.append((number, match.group(0), page, anchor))
    return found


def test_slug_follows_github() -> None:
    """The slug rule gives GitHub's anchors for the kinds of headings the docs use."""
    assert slug("Long runs: memory") == "long-runs-memory"
    assert slug("The model's arithmetic") == "the-models-arithmetic"
    assert (
        slug("The endpoint silence (`PARLEY_MIN_SILENCE_MS`): 400 ms, measured (2026-12-02)")
        == "the-endpoint-silence-parley_min_silence_ms-400-ms-measured-2026-12-02"
    )
    assert slug("Partials every 0.5 s (0.8 → 0.5, kept)") == "partials-every-05-s-08--05-kept"


def test_every_docs_citation_names_a_heading_that_exists() -> None:
    """No citation in code, help texts or docs points at a missing page or heading."""
    checked = 0
    wrong = []
    for path in sources():
        for number, written, page, anchor in citations(path):
            checked += 1
            reason = broken(page, anchor)
            if reason is not None:
                wrong.append(f"{path.relative_to(REPO)}:{number}: {written}: {reason}")
    assert checked > 100, f"only {checked} citations found: is the pattern right?"
    assert not wrong, "docs citations that point nowhere:\n" + "\n".join(wrong)


def test_code_cites_sections_by_anchor_not_by_name() -> None:
    """Code cites a section as docs/<page>.md#<anchor>, which the test above can check, not
    as docs/<page>.md, "Its title" (the history keeps its old text)."""
    history = REPO / "docs" / "history"
    wrong = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sources()
        if history not in path.parents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if BY_NAME.search(line)
    ]
    assert not wrong, "sections cited by name:\n" + "\n".join(wrong)


def test_a_missing_heading_is_caught(tmp_path: Path) -> None:
    """The check itself fails on a heading that is not there."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A section\n\n```\n## not a heading\n```\n## A section\n")
    assert anchors(page) == {"title", "a-section", "a-section-1"}
    assert broken(page, "a-section") is None
    assert broken(page, "not-a-heading") == "no heading #not-a-heading"
    assert broken(tmp_path / "nowhere.md", None) == "no such page"
