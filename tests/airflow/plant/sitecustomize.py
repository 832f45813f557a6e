"""A planted failure for the run-state tests: with EAGLE3_TEST_PLANT=lossless_gate on PYTHONPATH's first entry,
the evaluate stage measures and writes EVAL/report.json as usual, then its lossless gate fails as it would on a
real decoder bug (report.json says so, GateFailed, exit 3). Only processes that import eagle3.evaluate change.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

PLANT = os.environ.get("EAGLE3_TEST_PLANT")


def _plant(module) -> None:
    measured = module.evaluate

    def evaluate(cfg):
        from eagle3 import storage
        from eagle3.errors import GateFailed

        measured(cfg)
        path = storage.join(cfg.out, "report.json")
        report = storage.read_json(path)
        report["lossless"] = False
        report["lossless_verdict"] = {"verdict": "failed", "tie_flips": 0, "text": "FAILED", "divergences": [
            {"prompt": "planted", "position": 3}]}
        storage.write_json(path, report)
        raise GateFailed(f"{cfg.backend}: speculative output differs from the baseline on 1 prompt(s):\n"
                         "  prompt planted: first difference at generated position 3 (planted by tests/airflow/"
                         f"plant)\n(report: {path})")

    module.evaluate = evaluate


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "eagle3.evaluate":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _plant(module)

        spec.loader.exec_module = exec_module
        return spec


if PLANT == "lossless_gate":
    sys.meta_path.insert(0, _Finder())
