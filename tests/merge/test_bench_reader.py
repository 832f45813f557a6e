"""The merge benchmark's fast seed-JSONL reader gives the same arrays as json.loads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from eagle3.merge_arrays import content_id

BENCH = Path(__file__).resolve().parents[2] / "bench" / "merge_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("merge_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fast_reader_matches_json(tmp_path):
    bench = load_bench()
    src = tmp_path / "seed.jsonl"
    bench.generate(str(src), 40, seed=3, mean_len=30)
    with open(src, "a") as f:  # other spacing, key order and a one-token sample
        f.write(json.dumps({"loss_mask": [0, 1, 1], "input_ids": [5, 6, 7]}, separators=(",", ":")) + "\n")
        f.write('{"input_ids": [9], "loss_mask": [1]}\n')
    expected = [json.loads(line) for line in src.read_text().splitlines()]
    tables = list(bench.read_seed_jsonl(str(src), rows_per_table=16))
    got = [r for t in tables for r in t.to_pylist()]
    assert [r["input_ids"] for r in got] == [e["input_ids"] for e in expected]
    assert [r["loss_mask"] for r in got] == [e["loss_mask"] for e in expected]
    assert [r["id"] for r in got] == [content_id(np.array(e["input_ids"]), np.array(e["loss_mask"]))
                                      for e in expected]
