"""PublishOperator.after: a draft not published skips the task (so no Asset event fires) and keeps the reason
for the report; a published one puts its location and τ on every outlet's Asset event."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowSkipException

from operators.stage import PublishOperator

ASSET = Asset("s3://registry/drafts")


def _context(events: dict) -> dict:
    return {"ti": SimpleNamespace(map_index=-1), "dag": SimpleNamespace(dag_id="eagle3_train"),
            "run_id": "run1", "outlet_events": events}


def _op(tmp_path) -> PublishOperator:
    return PublishOperator(task_id="publish", root=str(tmp_path), config={}, outlets=[ASSET])


def test_not_published_skips_with_the_reason_and_keeps_it(tmp_path):
    events = {ASSET: SimpleNamespace(extra={})}
    result = {"published": False, "reason": "τ 1.500 does not beat the previous best 1.800 (entry 3)",
              "location": None, "acceptance_length": 1.5}
    with pytest.raises(AirflowSkipException) as info:
        _op(tmp_path).after(result, _context(events))
    assert str(info.value) == "not published: τ 1.500 does not beat the previous best 1.800 (entry 3)"
    kept = tmp_path / "runs" / "eagle3_train" / "run1" / "summaries" / "publish.json"
    assert json.loads(kept.read_text()) == result  # the report names why
    assert events[ASSET].extra == {}  # no event content: the skip suppresses the event


def test_published_puts_location_and_tau_on_the_asset_event(tmp_path):
    events = {ASSET: SimpleNamespace(extra={})}
    result = {"published": True, "reason": "τ 2.100 is the first draft published", "location": "s3://r/d/7",
              "acceptance_length": 2.1, "sha256": "ab" * 32}
    assert _op(tmp_path).after(result, _context(events)) is result
    assert events[ASSET].extra == {"location": "s3://r/d/7", "acceptance_length": 2.1}
