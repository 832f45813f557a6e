"""DAG parse time of dags/eagle3_train.py against an empty DAG, measured in the same run.

Both files are executed in fresh module namespaces, alternately, after one
warm-up each (the DAG processor keeps Airflow itself imported). Prints the
medians and the difference; the goal is under 0.3 s for eagle3_train.

    .venv/bin/python bench/dag_parse_bench.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMPTY_DAG = """
from airflow.sdk import dag, task, Asset

@dag(dag_id="empty", schedule=None)
def empty():
    @task
    def noop():
        pass
    noop()

empty()
"""


def parse_once(path: Path) -> float:
    t = time.perf_counter()
    spec = importlib.util.spec_from_file_location(f"bench_dag_{time.perf_counter_ns()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    sys.path.insert(0, str(REPO))
    import airflow.sdk  # noqa: F401  (the DAG processor has this imported already)

    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp, "empty_dag.py")
        empty.write_text(EMPTY_DAG)
        target = REPO / "dags" / "eagle3_train.py"
        first_empty, first_target = parse_once(empty), parse_once(target)  # warm-up: first imports
        e, d = [], []
        for _ in range(args.repeat):
            e.append(parse_once(empty))
            d.append(parse_once(target))
    heavy = sorted({k.split(".")[0] for k in sys.modules} & {"torch", "transformers", "pandas", "pyarrow"})
    me, md = statistics.median(e), statistics.median(d)
    print(f"first parse (cold imports): empty {first_empty:.3f}s, eagle3_train {first_target:.3f}s")
    print(f"median of {args.repeat}: empty DAG {me * 1000:.1f} ms, eagle3_train {md * 1000:.1f} ms, "
          f"ratio {md / me:.1f}x, difference {(md - me) * 1000:.1f} ms")
    print(f"goal eagle3_train < 300 ms: {'met' if md < 0.3 else 'NOT met'}; heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
