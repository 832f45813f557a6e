"""The command lines README.md and docs/*.md show, for tests that check them against the real parsers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A flag is a --name led by whitespace or a synopsis's "[": not the server flags inside --server-args=--a,b.
_FLAG = re.compile(r"(?:(?<=[\s\[])|^)(--[a-z][a-z0-9-]*)")


def documented_flags(program: str) -> list[tuple[str, int, str, str]]:
    """(file, line, what follows ``program``'s first word, flag) for each flag shown after ``program``: a regex
    of the program's name, e.g. r"eagle3 (train)" (group 1 names the command) or r"bench/(train)_bench\\.py".
    A shell line continuation joins the next line; a backtick, a pipe between spaces (a synopsis's a|b is not one),
    ;, & or ) ends the command."""
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            start, line = i + 1, lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i]
            for m in re.finditer(r"(?:^|[\s`(/])" + program + r"((?: (?:(?! \| )[^`;&)])*)?)", line):
                for flag in _FLAG.findall(m.group(2)):
                    found.append((str(doc.relative_to(ROOT)), start, m.group(1), flag))
            i += 1
    return found
