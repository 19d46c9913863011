"""Code comments cite pages of this repository, and the pages and anchors they cite exist.

Comments and docstrings in ``daisy_nb/`` explain a choice by citing ``docs/<page>.md#anchor``.
A citation of a page or an anchor that does not exist fails here (``mkdocs build --strict``
checks the links between pages; this checks the code's). Citations of the specifications that
are not in the repository ("CORE.md 10.2", "API.md 1.4") and of issue numbers are the old style:
``KNOWN_EXTERNAL_CITATIONS`` lists where they remain, and a count may only go down.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

CITATION = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")
EXTERNAL = re.compile(
    r"\bCORE(?:\.md)?\s*(?:§|sections?\b|\d+\.\d+|\d+\b)|\bAPI\.md\b|\bissues?\s*#?\d+|\(#\d+\)",
    re.I,
)

# Where the old style remains, at most this many per file (none: every citation names a page of docs/).
KNOWN_EXTERNAL_CITATIONS: dict[str, int] = {}
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
EXPLICIT_ID = re.compile(r"\{\s*#([\w-]+)[^}]*\}\s*$")


def sources() -> list[Path]:
    return [p for p in sorted((ROOT / "daisy_nb").rglob("*.py")) if "_shim" not in p.parts]


def slug(text: str) -> str:
    """Python-Markdown's toc slug (what mkdocs uses for headings without an explicit id)."""
    text = re.sub(r"[^\w\s-]", "", re.sub(r"`", "", text)).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    out = set()
    for title in HEADING.findall(text):
        m = EXPLICIT_ID.search(title)
        out.add(m.group(1) if m else slug(title))
    return out


def test_cited_pages_and_anchors_exist():
    cited = 0
    problems = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for page, anchor in CITATION.findall(line):
                cited += 1
                target = DOCS / page
                if not target.is_file():
                    problems.append(f"{rel}:{n}: docs/{page} does not exist")
                elif anchor and anchor not in anchors(target):
                    problems.append(f"{rel}:{n}: docs/{page} has no anchor #{anchor}")
    assert not problems, "\n".join(problems)
    assert cited >= 10  # the rewritten citations are found (a broken pattern would pass vacuously)


def test_no_new_citations_of_documents_outside_the_repository():
    found: dict[str, list[str]] = {}
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in EXTERNAL.finditer(line):
                found.setdefault(rel, []).append(f"{rel}:{n}: {m.group(0)!r}")
    too_many = [
        f"{rel}: {len(hits)} (known: {KNOWN_EXTERNAL_CITATIONS.get(rel, 0)})\n  " + "\n  ".join(hits)
        for rel, hits in sorted(found.items())
        if len(hits) > KNOWN_EXTERNAL_CITATIONS.get(rel, 0)
    ]
    assert not too_many, "cite docs/<page>.md#anchor instead:\n" + "\n".join(too_many)


def test_readme_links_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if "://" in target:
            continue
        page, _, anchor = target.partition("#")
        path = ROOT / page
        if not path.exists():
            missing.append(target)
        elif anchor and anchor not in anchors(path):
            missing.append(target)
    assert not missing, missing


def test_environment_reference_matches_the_code():
    """Every DAISY_* variable daisy_nb reads has a line in the docs' table, and no line is stale."""
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "_hooks" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    records = gen.environment_records()  # raises with the names when code and table disagree
    names = [r[0] for r in records]
    assert "DAISY_CONTEXT" in names and "DAISY_NB_TRACKING_IO" in names
    assert all(r[3] for r in records)  # each is read somewhere
