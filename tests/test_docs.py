"""The repository's documents cite only what is in the repository: docs/design.md, by sections that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# Spelt in two pieces so that this file does not match itself.
FORBIDDEN = ("DESIGN" + " §", "shared/" + "DESIGN")
# "docs/design.md §5.4" in code, "[design.md](design.md) §5.4" in the docs.
CITATION = re.compile(r"design\.md\)? §(\d+(?:\.\d+)*)")
SECTION = re.compile(r"^#{2,3} §(\d+(?:\.\d+)*) ", re.MULTILINE)


def tracked_texts() -> dict[str, str]:
    """Every tracked file that reads as UTF-8 text, by its path in the repository."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True)
    texts = {}
    for name in filter(None, listing.stdout.split("\0")):
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def test_nothing_cites_the_design_document_outside_the_repository() -> None:
    found = [
        f"{name}:{number}"
        for name, text in tracked_texts().items()
        for number, line in enumerate(text.splitlines(), start=1)
        if any(pattern in line for pattern in FORBIDDEN)
    ]
    assert not found, f"cite docs/design.md instead: {found}"


def test_every_design_citation_names_a_section_that_exists() -> None:
    sections = set(SECTION.findall(DESIGN.read_text(encoding="utf-8")))
    cited = {(name, section) for name, text in tracked_texts().items() for section in CITATION.findall(text)}
    assert cited, "no citations of docs/design.md found: the pattern no longer matches how they are written"
    missing = sorted(f"{name} cites §{section}" for name, section in cited if section not in sections)
    assert not missing, f"docs/design.md has no such section: {missing}"
