"""The regenerate stage with the openai backend against a real HTTP server (fake_openai_server.py, a
subprocess on 127.0.0.1) that can fail the first N requests with a chosen status."""

from __future__ import annotations

import logging

import pytest
import yaml
from regen_helpers import conversations, read_jsonl, write_dataset

from eagle3.errors import InputError
from eagle3.regenerate import RegenerateConfig, TooManyErrors, regenerate
from eagle3.regenerate.openai_backend import chat_completions_url


def cfg(manifest, out, server, **kw) -> RegenerateConfig:
    base = dict(manifest=str(manifest), out=str(out), backend="openai", model="target",
                base_url=server.url, concurrency=4, backoff_s=0.01, max_tokens=32)
    return RegenerateConfig(**{**base, **kw})


def test_replays_turn_by_turn_and_keeps_provenance(tmp_path, fake_server):
    server = fake_server("--reasoning")
    manifest = write_dataset(tmp_path, conversations(3, turns=2),
                             extra=[{"name": "other", "source": "chat.jsonl", "format": "messages"}])
    summary = regenerate(cfg(manifest, tmp_path / "out", server))
    recs = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert [r["source"]["line"] for r in recs] == [1, 2, 3]  # rewritten in source order at the end
    r = recs[1]
    assert [m["content"] for m in r["messages"]] == [
        "You are terse.", "question 1.0 what is 1 plus 0?", "answer 0 to: question 1.0 what is 1 plus 0?",
        "question 1.1 what is 1 plus 1?", "answer 1 to: question 1.1 what is 1 plus 1?"]
    assert r["messages"][2]["reasoning_content"] == "thinking about question 1.0 what is 1 plus 0?"
    assert r["original_messages"][2]["content"] == "original answer 1.0"
    assert r["regeneration"]["max_tokens"] == 32 and r["regeneration"]["model"] == "target"
    # The second request of a conversation carried the first regenerated answer.
    second = [e for e in server.entries() if len(e["messages"]) == 4 and "1.1" in e["messages"][3]["content"]]
    assert second[0]["messages"][2]["content"].startswith("answer 0 to: question 1.0")
    assert all(e["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 42}
               for e in server.entries())
    # The derived manifest swaps the source of the regenerated dataset only.
    derived = yaml.safe_load(open(summary["manifest"]))["datasets"]
    assert derived[0]["source"] == str(tmp_path / "out/chat/regenerated.jsonl")
    assert derived[0]["format"] == "messages" and derived[0]["regenerate"] is False
    assert derived[1]["source"] == str(tmp_path / "chat.jsonl")


def test_accounting_equals_server_usage(tmp_path, fake_server):
    server = fake_server()
    manifest = write_dataset(tmp_path, conversations(5, turns=2))
    stats = regenerate(cfg(manifest, tmp_path / "out", server, price_prompt_per_m=2.0,
                           price_completion_per_m=10.0))["datasets"]["chat"]
    usage = [e["usage"] for e in server.entries()]
    prompt, completion = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    assert stats["requests"] == len(usage) == 10
    assert (stats["prompt_tokens"], stats["completion_tokens"]) == (prompt, completion)
    assert (stats["this_run"]["prompt_tokens"], stats["this_run"]["completion_tokens"]) == (prompt, completion)
    assert stats["cost_usd"] == pytest.approx((prompt * 2.0 + completion * 10.0) / 1e6)
    on_disk = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert sum(r["regeneration"]["prompt_tokens"] for r in on_disk) == prompt


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retries_transient_failures_then_succeeds(tmp_path, fake_server, status):
    server = fake_server("--fail-first", "3", "--fail-status", str(status))
    manifest = write_dataset(tmp_path, conversations(2, turns=1))
    stats = regenerate(cfg(manifest, tmp_path / "out", server, concurrency=1))["datasets"]["chat"]
    assert stats["done"] == 2 and stats["failed"] == 0
    assert stats["this_run"]["retries"] == 3 and stats["this_run"]["attempts"] == 5
    assert [e["status"] for e in server.entries()] == [status] * 3 + [200, 200]


def test_persistent_failure_goes_to_errors_and_threshold_fails(tmp_path, fake_server):
    server = fake_server("--fail-first", "1000", "--fail-status", "503")
    manifest = write_dataset(tmp_path, conversations(2, turns=1))
    with pytest.raises(TooManyErrors, match="2 of 2 conversations failed"):
        regenerate(cfg(manifest, tmp_path / "out", server, max_retries=2))
    errors = read_jsonl(tmp_path / "out/chat/errors.jsonl")
    assert len(errors) == 2 and all("HTTP 503" in e["reason"] and e["attempts"] == 3 for e in errors)
    assert errors[0]["file"] == str(tmp_path / "chat.jsonl") and errors[0]["line"] in (1, 2)


def test_errors_under_threshold_do_not_fail(tmp_path, fake_server):
    server = fake_server("--fail-first", "1", "--fail-status", "400")  # a 400 is not retried
    manifest = write_dataset(tmp_path, conversations(4, turns=1))
    stats = regenerate(cfg(manifest, tmp_path / "out", server, concurrency=1,
                           max_error_share=0.25))["datasets"]["chat"]
    assert (stats["done"], stats["failed"], stats["passed"]) == (3, 1, True)
    (err,) = read_jsonl(tmp_path / "out/chat/errors.jsonl")
    assert "HTTP 400" in err["reason"] and "not retried" in err["reason"] and err["attempts"] == 1


def test_api_key_is_sent_but_never_logged_or_written(tmp_path, fake_server, monkeypatch, caplog):
    secret = "sk-test-SECRET-4242"
    monkeypatch.setenv("EAGLE3_OPENAI_API_KEY", secret)
    server = fake_server("--fail-first", "1", "--fail-status", "429")
    manifest = write_dataset(tmp_path, conversations(1, turns=1))
    with caplog.at_level(logging.DEBUG):
        summary = regenerate(cfg(manifest, tmp_path / "out", server))
    assert server.entries()[-1]["auth"] == f"Bearer {secret}"
    assert secret not in caplog.text and secret not in repr(summary)
    for f in (tmp_path / "out").rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(), f


def test_changed_settings_refuse_to_mix(tmp_path, fake_server):
    server = fake_server()
    manifest = write_dataset(tmp_path, conversations(2, turns=1))
    regenerate(cfg(manifest, tmp_path / "out", server))
    with pytest.raises(InputError, match="--restart"):
        regenerate(cfg(manifest, tmp_path / "out", server, temperature=0.7))
    stats = regenerate(cfg(manifest, tmp_path / "out", server, temperature=0.7, restart=True))["datasets"]["chat"]
    assert stats["resumed"] == 0 and stats["done"] == 2


def test_missing_url_and_bad_dataset_are_input_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLE3_OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    manifest = write_dataset(tmp_path, conversations(1))
    with pytest.raises(InputError, match="--base-url"):
        regenerate(RegenerateConfig(manifest=str(manifest), out=str(tmp_path / "o"), backend="openai"))
    with pytest.raises(InputError, match="'nope' is not in"):
        regenerate(RegenerateConfig(manifest=str(manifest), out=str(tmp_path / "o"), datasets=("nope",)))
    with pytest.raises(InputError, match="backend="):
        RegenerateConfig(manifest="m", out="o", backend="vllm")


def test_chat_completions_url_forms():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://openrouter.ai/api/v1") == "https://openrouter.ai/api/v1/chat/completions"
    assert chat_completions_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_parquet_source_and_output_read_by_tokenize(tmp_path, fake_server):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle3.datasets.readers import Conversation, read_records

    server = fake_server("--reasoning")
    rows = [{"messages": json.dumps(c["messages"])} for c in conversations(3, turns=1)]  # JSON strings
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"datasets": [
        {"name": "chat", "source": "chat.parquet", "format": "messages", "regenerate": True}]}))
    summary = regenerate(cfg(manifest, tmp_path / "out", server))
    (spec,) = yaml.safe_load(open(summary["manifest"]))["datasets"]
    got = list(read_records(spec["source"], spec["format"]))
    assert len(got) == 3 and all(isinstance(c, Conversation) for c in got)
    answer = got[0].messages[2]
    assert answer["content"].startswith("answer 0 to: question 0.0")
    assert answer["reasoning_content"].startswith("thinking about")


def test_changed_source_line_is_redone_and_stale_answer_dropped(tmp_path, fake_server):
    server = fake_server()
    convs = conversations(3, turns=1)
    manifest = write_dataset(tmp_path, convs)
    regenerate(cfg(manifest, tmp_path / "out", server))
    convs[1]["messages"][1]["content"] = "a brand new question"
    write_dataset(tmp_path, convs)
    stats = regenerate(cfg(manifest, tmp_path / "out", server))["datasets"]["chat"]
    assert (stats["resumed"], stats["this_run"]["requests"], stats["done"]) == (2, 1, 3)
    recs = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert [r["messages"][1]["content"] for r in recs][1] == "a brand new question"
    assert len(recs) == 3


def test_regenerated_source_is_where_the_stage_writes(tmp_path, fake_server):
    from eagle3.layout import regenerated as regenerated_dir
    from eagle3.layout import regenerated_source

    server = fake_server()
    manifest = write_dataset(tmp_path, conversations(1, turns=1))
    stats = regenerate(cfg(manifest, regenerated_dir(str(tmp_path / "root")), server))["datasets"]["chat"]
    assert stats["output"] == regenerated_source(str(tmp_path / "root"), "chat")
    assert read_jsonl(regenerated_source(str(tmp_path / "root"), "chat"))[0]["id"]


def test_a_new_seed_keeps_greedy_answers_but_not_sampled_ones(tmp_path, fake_server):
    """The run's seed also orders the merge and the training: changing it must not demand a new greedy
    regeneration, whose answers do not depend on it; sampled answers do."""
    server = fake_server()
    manifest = write_dataset(tmp_path, conversations(2, turns=1))
    regenerate(cfg(manifest, tmp_path / "out", server, seed=1))
    again = regenerate(cfg(manifest, tmp_path / "out", server, seed=2))["datasets"]["chat"]
    assert again["resumed"] == 2 and again["this_run"]["requests"] == 0
    regenerate(cfg(manifest, tmp_path / "sampled", server, seed=1, temperature=0.7))
    with pytest.raises(InputError, match=r"seed=1; this run asks for seed=2"):
        regenerate(cfg(manifest, tmp_path / "sampled", server, seed=2, temperature=0.7))


def test_an_edited_record_keeps_its_id_and_is_answered_again(tmp_path, fake_server):
    """Resume matches a record's own id and its content: an edited prompt whose id stayed is answered again
    (its old answer dropped), and a record moved in the file keeps its answer at the line it is on now."""
    server = fake_server()
    convs = [{"id": f"c{i}", **c} for i, c in enumerate(conversations(3, turns=1))]
    manifest = write_dataset(tmp_path, convs)
    regenerate(cfg(manifest, tmp_path / "out", server))
    convs[1]["messages"][1]["content"] = "a brand new question"
    write_dataset(tmp_path, convs[::-1])
    stats = regenerate(cfg(manifest, tmp_path / "out", server))["datasets"]["chat"]
    assert (stats["resumed"], stats["this_run"]["requests"], stats["done"]) == (2, 1, 3)
    recs = read_jsonl(tmp_path / "out/chat/regenerated.jsonl")
    assert [(r["id"], r["source"]["line"]) for r in recs] == [("c2", 1), ("c1", 2), ("c0", 3)]  # the user's ids
    assert recs[1]["messages"][1:] == [{"role": "user", "content": "a brand new question"},
                                       {"role": "assistant", "content": "answer 0 to: a brand new question"}]


def test_duplicate_ids_are_refused_before_any_request(tmp_path, fake_server):
    server = fake_server()
    convs = [{"id": i, **c} for i, c in zip(["a", "b", "a"], conversations(3, turns=1))]
    manifest = write_dataset(tmp_path, convs)
    with pytest.raises(InputError) as err:
        regenerate(cfg(manifest, tmp_path / "out", server))
    text = str(err.value)
    assert f"{tmp_path / 'chat.jsonl'}: lines 1 and 3 both have id 'a'" in text, text
    assert "another id" in text
    assert server.entries() == []  # refused before a paid request


def test_derived_manifest_names_datasets_left_on_their_original_answers(tmp_path, fake_server, caplog):
    server = fake_server()
    manifest = write_dataset(tmp_path, conversations(2, turns=1), extra=[
        {"name": "later", "source": "chat.jsonl", "format": "messages", "regenerate": True}])
    with caplog.at_level(logging.WARNING, logger="eagle3.regenerate"):
        summary = regenerate(cfg(manifest, tmp_path / "out", server, datasets=("chat",)))
    assert summary["incomplete"] == {"later": "not regenerated yet"}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'later'" in warning and "original answers" in warning, warning
    derived = yaml.safe_load(open(summary["manifest"]))["datasets"]
    assert derived[1]["source"] == str(tmp_path / "chat.jsonl")
    # An interrupted run leaves stats.json saying how far it got.
    (tmp_path / "out/later").mkdir()
    (tmp_path / "out/later/stats.json").write_text(
        '{"complete": false, "passed": true, "done": 1, "conversations": 2, "failed": 0}')
    summary = regenerate(cfg(manifest, tmp_path / "out", server, datasets=("chat",)))
    assert summary["incomplete"] == {"later": "unfinished: 1 of 2 conversations done"}


def test_answers_cut_at_max_tokens_are_counted_and_warned_about(tmp_path, fake_server, caplog):
    manifest = write_dataset(tmp_path, conversations(30, turns=1))
    few = fake_server("--length-for", "question 7.")  # 1 of 30: under the warning share
    with caplog.at_level(logging.INFO, logger="eagle3.regenerate"):
        stats = regenerate(cfg(manifest, tmp_path / "few", few))["datasets"]["chat"]
    assert (stats["turns_at_max_tokens"], stats["requests"]) == (1, 30)
    assert "1 of 30 answers stopped at max_tokens" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    many = fake_server("--length-for", "question 1")  # questions 1 and 10-19: 11 of 30
    for run in ("first", "resumed"):  # counted from the output, so a resumed run says it too
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="eagle3.regenerate"):
            stats = regenerate(cfg(manifest, tmp_path / "many", many))["datasets"]["chat"]
        assert stats["turns_at_max_tokens"] == 11 and stats["this_run"]["requests"] == (30 if run == "first" else 0)
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "11 of 30 answers (36.7%) stopped at max_tokens=32" in warning and "--max-tokens" in warning, warning
