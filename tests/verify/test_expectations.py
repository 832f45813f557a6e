"""The gate's expectation checks: a stale merge, another drop list or sources, wrong totals, a dropped dataset's
rows each fail; what the run asked for passes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from eagle3 import storage
from eagle3.errors import GateFailed
from eagle3.merge import MergeConfig, merge
from eagle3.verify import VerifyConfig, verify
from tests.merge.prepared_factory import random_rows, write_prepared

L = 24


@pytest.fixture
def prep(tmp_path) -> str:
    rng = np.random.default_rng(4)
    return write_prepared(tmp_path / "prep", {"a": random_rows(rng, 40), "b": random_rows(rng, 30),
                                              "c": random_rows(rng, 20)})


def _merge(prep, tmp_path, **kw) -> str:
    out = str(tmp_path / "merged")
    merge(MergeConfig(prepared=prep, out=out, max_seq_len=L, seed=5, **kw))
    return out


def _failed(merged, **expect) -> dict:
    with pytest.raises(GateFailed) as err:
        verify(VerifyConfig(merged, **expect))
    result = json.loads(open(os.path.join(merged, "verify.json")).read())
    checks = {c["name"]: c for c in result["checks"]}
    return {"failed": set(result["failed"]), "message": str(err.value), **checks}


def _checks(merged, **expect) -> dict:
    return {c["name"]: c for c in verify(VerifyConfig(merged, **expect))["checks"]}


def test_what_the_run_asked_for_passes_and_is_recorded(prep, tmp_path):
    merged = _merge(prep, tmp_path, drop=("c",))
    checks = _checks(merged, expect_seed=5, expect_max_seq_len=L, expect_drop=["c"], expect_sources="a,b")
    assert checks["expectations"]["passed"] and checks["expectations"]["unchecked"] == []
    assert checks["expectations"]["expected"] == {"seed": 5, "max_seq_len": L, "drop": ["c"], "sources": ["a", "b"]}
    assert checks["totals"]["passed"] and checks["totals"]["rows"] == checks["totals"]["summed"]["samples_out"]
    assert checks["dropped_datasets"]["passed"] and checks["dropped_datasets"]["drop_list"] == ["c"]
    # nothing asked: the check passes and says what it did not check
    assert _checks(merged)["expectations"]["unchecked"] == ["drop", "max_seq_len", "seed", "sources"]


def test_a_stale_merge_of_another_seed_and_length_fails(prep, tmp_path):
    merged = _merge(prep, tmp_path)
    got = _failed(merged, expect_seed=6, expect_max_seq_len=L + 1)
    assert got["failed"] == {"expectations"}
    assert "seed: manifest 5 but this run asked for 6" in got["message"]
    assert f"max_seq_len: manifest {L} but this run asked for {L + 1}" in got["message"]


def test_another_drop_list_or_sources_fails(prep, tmp_path):
    merged = _merge(prep, tmp_path, drop=("c",))
    got = _failed(merged, expect_drop=())
    assert got["failed"] == {"expectations"} and "drop: manifest ['c'] but this run asked for []" in got["message"]
    got = _failed(merged, expect_sources=("a", "b", "c"))
    assert "sources: manifest ['a', 'b'] but this run asked for ['a', 'b', 'c']" in got["message"]


def test_the_dataset_manifest_gives_sources_and_its_drop_marks(prep, tmp_path):
    (tmp_path / "m.yaml").write_text("datasets:\n  - {name: a, source: a.jsonl, format: messages}\n  - {name: b, source: b.jsonl, format: messages}\n"
                                     "  - {name: c, source: c.jsonl, format: messages, drop: true}\n")
    merged = _merge(prep, tmp_path, manifest=str(tmp_path / "m.yaml"))
    checks = _checks(merged, expect_manifest=str(tmp_path / "m.yaml"), expect_drop=())
    assert checks["expectations"]["expected"]["drop"] == ["c"]
    assert checks["expectations"]["expected"]["sources"] == ["a", "b"]
    # a merge that ignored the manifest's drop mark is refused
    merged = _merge(prep, tmp_path)
    got = _failed(merged, expect_manifest=str(tmp_path / "m.yaml"), expect_drop=())
    assert "sources: manifest ['a', 'b', 'c'] but this run asked for ['a', 'b']" in got["message"]


def _edit_manifest(merged, edit) -> None:
    path = os.path.join(merged, "manifest.json")
    man = storage.read_json(path)
    edit(man)
    storage.write_json(path, man)


def test_totals_that_are_not_the_sum_of_the_sources_fail(prep, tmp_path):
    merged = _merge(prep, tmp_path)
    _edit_manifest(merged, lambda m: m["totals"].update(tokens_in=m["totals"]["tokens_in"] + 3))
    got = _failed(merged)
    assert got["failed"] == {"totals"} and "tokens_in: totals" in got["message"]
    merged = _merge(prep, tmp_path)
    _edit_manifest(merged, lambda m: m["totals"]["dropped"].update(duplicate=99))
    assert "dropped: totals" in _failed(merged)["message"]


def test_a_dropped_dataset_with_rows_fails(prep, tmp_path):
    """The drop list not applied, but the manifest says it was: only this check sees it (the per-source
    accounting of a listed source balances)."""
    merged = _merge(prep, tmp_path)
    _edit_manifest(merged, lambda m: m["dropped_datasets"].append({"name": "c", "reason": "drop list"}))
    got = _failed(merged)
    assert got["failed"] == {"dropped_datasets"}
    assert "c: 20 rows in train.parquet" in got["message"]
    assert "c: listed under the manifest's sources with samples_out 20" in got["message"]
