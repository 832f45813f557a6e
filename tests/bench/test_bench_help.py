"""Every benchmark script still starts: ``--help`` exits 0 and prints its usage.

The benches run by hand (README, docs), not in the suite, so an import they lose goes unnoticed until a user
runs one: eagle3/regenerate/bench.py imported ``regenerate`` from the stage module after it moved.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
