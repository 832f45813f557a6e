"""Every ``from <project package> import name`` in the code resolves, the ones inside functions too.

Stages keep heavy imports inside functions (so --help and DAG parsing stay fast), which leaves them
unchecked until that path runs: eagle3/regenerate/bench.py imported a function from a module it had
left. This walks every file's syntax tree and resolves each project import it finds, in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("eagle3", "operators", "plugins", "bench", "tests", "dags", "demo")

SCAN = textwrap.dedent("""
    import ast, importlib, sys
    from pathlib import Path
    packages, folders = sys.argv[1].split(","), sys.argv[2].split(",")
    for f in sorted(p for d in folders for p in Path(d).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in packages:
                try:
                    mod = importlib.import_module(node.module)
                except Exception as e:
                    print(f"{f}:{node.lineno}: import {node.module}: {e!r}"); continue
                for a in node.names:
                    if a.name == "*" or hasattr(mod, a.name):
                        continue
                    try:
                        importlib.import_module(node.module + "." + a.name)
                    except Exception:
                        print(f"{f}:{node.lineno}: {node.module} has no {a.name}")
""")


def _scan(root: Path, folders: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCAN, ",".join(PACKAGES), ",".join(folders)], cwd=root,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_project_imports_resolve():
    folders = [d for d in ("eagle3", "bench", "dags", "operators", "plugins", "demo", "scripts", "tests")
               if (ROOT / d).is_dir()]
    assert _scan(ROOT, folders) == []


def test_the_scan_finds_a_moved_name(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "x.py").write_text("def f():\n    from eagle3.regenerate.stage import regenerate\n")
    assert _scan(tmp_path, ["probe"]) == ["probe/x.py:2: eagle3.regenerate.stage has no regenerate"]
