"""The repository speaks of the product: no file refers to how it was developed (sessions,
rounds, issue numbers) or to documents that are not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACES = ("README.md", "Makefile", "pyproject.toml", "history_pipeline", "history_pipeline_tests", "bench", "docs")
TEXT = {".py", ".md", ".toml", ".dot", ".yaml", ".yml", ".json", ""}
#: units of work that may not be numbered in the product's files, and phrases of a work diary
WORK_UNITS = (r"[Ss]essions?\s", r"[Rr]ounds?\s", r"[Ii]ssues?\s#?")
DIARY = (r"slow\sspell",)
#: documents that live outside the repository
OUTSIDE = ("DESIGN", "FACTS", "TARGETS", "STYLE", "DECISIONS")
FORBIDDEN = re.compile(
    "|".join(rf"\b{unit}\d" for unit in WORK_UNITS)
    + r"|(?<![\w&])#\d{1,4}\b|" + "|".join(DIARY)
    + rf"|\b(?:{'|'.join(OUTSIDE)})\.md|(?<![A-Za-z])(?:RFC|rfc)(?![A-Za-z]|\s*\d)")


def text_files() -> list[Path]:
    """The repository's own text files (no environment, data or build output)."""
    found = []
    for place in PLACES:
        path = REPO / place
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        found += [p for p in candidates if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts]
    return found


def test_no_file_speaks_of_how_it_was_made():
    hits = []
    for path in text_files():
        if path == Path(__file__).resolve():
            continue  # it names the outside documents it forbids
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_what_it_should():
    n = 13  # examples are built here, so that this file holds none of them as written
    for text in (f"as in session {n}", f"Round {n} took", f"issue {n}", f"see #{n}", "DESIGN.md section 2",
                 "the RFC's handler", "in the slow\tspell", "docs/DECISIONS.md", "rfc_events", "tbl-rfc"):
        assert FORBIDDEN.search(text), text
    for text in ("a Spark session", "rounded half away", "no issue", "&#13;", "color #fff", "as in RFC 2119"):
        assert not FORBIDDEN.search(text), text


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "\n".join(broken)


def test_decision_records_are_short_and_indexed():
    folder = REPO / "docs" / "decisions"
    index = (folder / "README.md").read_text()
    records = sorted(folder.glob("[0-9][0-9][0-9][0-9]-*.md")) + sorted(folder.glob("new-*.md"))
    assert records
    for record in records:
        text = record.read_text()
        headings = re.findall(r"^## (\w+)", text, re.M)
        assert headings == ["Context", "Decision", "Consequences"], (record.name, headings)
        assert len(text.splitlines()) <= 60, f"{record.name} is longer than a page"
        if record.name[0].isdigit():
            assert f"({record.name})" in index, f"{record.name} is not in docs/decisions/README.md"
    numbers = [r.name[:4] for r in records if r.name[0].isdigit()]
    assert len(numbers) == len(set(numbers)), "two records share a number"


def test_the_architecture_page_lists_the_enforced_layers():
    from history_pipeline_tests.test_layering import LAYERS

    page = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \| .+ \|$", page, re.M)
    documented = {name: int(rank) for rank, names in rows for name in re.findall(r"`(\w+)`", names)}
    enforced = {prefix.rpartition(".")[2]: rank for prefix, (_, rank) in LAYERS.items() if "." in prefix}
    assert documented == enforced
