"""A failed task's error is kept in the run folder (and removed when a retry succeeds); regeneration with other
settings than the kept answers says which form field to change, and that field redoes it on the first try only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from eagle3.errors import InputError
from operators.stage import Eagle3StageOperator, RegenerateOperator


def context(try_number: int = 1, map_index: int = -1) -> dict:
    return {"ti": SimpleNamespace(map_index=map_index, try_number=try_number),
            "dag": SimpleNamespace(dag_id="dag"), "run_id": "run1"}


def test_a_failure_is_kept_with_its_first_lines_and_cleared_by_a_success(tmp_path):
    from eagle3.layout import RunLayout
    from eagle3.report import failures

    manifest = tmp_path / "m.yaml"
    op = Eagle3StageOperator(task_id="discover.plan", stage="discover", root=str(tmp_path),
                             config={"manifest": str(manifest), "root": str(tmp_path)})
    with pytest.raises(InputError):
        op.execute(context(try_number=1))
    (rec,) = failures.read(RunLayout(str(tmp_path), "dag", "run1")).values()
    assert rec["task_id"] == "discover.plan" and rec["error"] == "InputError" and rec["try_number"] == 1
    assert str(manifest) in rec["lines"][0], rec
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
                    + "\n")
    manifest.write_text(f"datasets:\n  - name: chat\n    source: {data}\n    format: messages\n")  # fixed
    op.execute(context(try_number=2))
    assert failures.read(RunLayout(str(tmp_path), "dag", "run1")) == {}


def test_regenerate_restart_applies_to_the_first_try_only(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(Eagle3StageOperator, "execute", lambda self, ctx: seen.append(self.config["restart"]))
    for try_number in (1, 2):
        op = RegenerateOperator(task_id="regenerate", root=str(tmp_path), config={"restart": True})
        op.execute(context(try_number=try_number))
    assert seen == [True, False]  # a retry resumes what the first try regenerated


def test_other_settings_name_the_form_field_and_only_what_differs(tmp_path):
    from eagle3.regenerate.output import RecordLog

    made = {"backend": "openai", "model": "m", "temperature": 0.0, "top_p": 1.0, "max_tokens": 128, "seed": 42}
    rec = {"id": "c1", "messages": [], "source": {"file": "x", "line": 1},
           "regeneration": {**made, "prompt_tokens": 1, "completion_tokens": 1, "turns": [{}]}}
    path = tmp_path / "chat" / "regenerated.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(InputError) as err:
        RecordLog(path, {**made, "backend": "hf", "max_tokens": 512})
    text = str(err.value)
    assert "backend='openai', max_tokens=128; this run asks for backend='hf', max_tokens=512" in text, text
    assert "Regenerate from scratch" in text and "regenerate_restart" in text and "--restart" in text
    assert "temperature" not in text  # the settings that agree are not listed
    assert len(RecordLog(path, {**made, "backend": "hf"}, restart=True).done) == 0  # restart redoes it
