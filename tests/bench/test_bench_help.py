"""Every benchmark script still starts: ``--help`` exits 0 and prints its usage.

The benches run by hand (README, docs), not in the suite, so an import they lose goes unnoticed until a user
runs one: eagle3/regenerate/bench.py imported ``regenerate`` from the stage module after it moved. Every flag
README.md and docs/*.md show for a bench is in its --help.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_scan import documented_flags

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*_bench.py"))
MODULES = ["eagle3.regenerate.bench"]


def test_the_bench_list_is_not_empty():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("argv", [[str(p)] for p in SCRIPTS] + [["-m", m] for m in MODULES],
                         ids=[p.name for p in SCRIPTS] + MODULES)
def test_bench_help(argv):
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    name = argv[-1].rsplit("/", 1)[-1].removesuffix(".py")
    shown = documented_flags("(" + re.escape(name) + ")" if argv[0] == "-m" else r"bench/(" + re.escape(name) + r")\.py")
    missing = [f"{doc}:{line}: {flag}" for doc, line, _, flag in shown
               if not re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", done.stdout)]
    assert not missing, f"documented flags {name} --help does not list:\n" + "\n".join(missing)


def test_documented_bench_flags_are_found():
    assert len(documented_flags(r"bench/(train_bench)\.py")) > 20
