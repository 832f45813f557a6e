"""The merge benchmark's two sides do the same work: the same samples come out of both."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parents[2] / "bench" / "merge_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("merge_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seed_style_and_eagle3_paths_keep_the_same_samples(tmp_path, smollm2_dir):
    bench = load_bench()
    src = tmp_path / "seed.jsonl"
    bench.generate(str(src), 300, seed=3, mean_len=40)  # includes exact duplicates
    bench.seed_style(str(src), str(tmp_path / "seed-out.jsonl"), 50, 42)
    bench.convert_child(str(src), str(tmp_path / "w"))  # the product's `eagle3 tokenize`
    bench.merge_child(str(tmp_path / "w"), 50, 42)
    seed = [json.loads(x) for x in (tmp_path / "seed-out.jsonl").read_text().splitlines()]
    ours = pq.read_table(tmp_path / "w" / "merged" / "train.parquet").to_pylist()
    key = lambda r: (tuple(r["input_ids"]), tuple(r["loss_mask"]))  # noqa: E731
    assert {key(r) for r in ours} == {key(r) for r in seed}
    assert len(ours) == len({key(r) for r in seed}) < len(seed)  # eagle3 also removes the duplicates
    assert max(len(r["input_ids"]) for r in ours) == 50
