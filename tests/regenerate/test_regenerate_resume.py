"""Resume: the CLI as a real subprocess, SIGKILLed mid-run, then run again to completion."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from regen_helpers import conversations, read_jsonl, write_dataset

from eagle3.regenerate.output import RecordLog

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(manifest, out, url, *extra) -> list[str]:
    return [sys.executable, "-m", "eagle3.cli", "regenerate", "--manifest", str(manifest), "--out", str(out),
            "--backend", "openai", "--base-url", url, "--model", "target", "--concurrency", "2",
            "--max-tokens", "16", *extra]


def wait_lines(path, n: int, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines")


def test_sigkill_then_rerun_skips_done(tmp_path, fake_server):
    manifest = write_dataset(tmp_path, conversations(12, turns=1))
    out = tmp_path / "out"
    records = out / "chat" / "regenerated.jsonl"
    slow = fake_server("--delay", "0.3")
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen(cli(manifest, out, slow.url), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_lines(records, 3, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    before = [json.loads(line) for line in records.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]
    assert 3 <= len(before) < 12
    done_lines = {r["source"]["line"] for r in before}

    second = fake_server()  # a fresh server: its log holds only what the rerun asked for
    rerun = subprocess.run(cli(manifest, out, second.url), env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = read_jsonl(records)
    assert sorted(r["source"]["line"] for r in after) == list(range(1, 13))  # each once, none lost
    asked = {int(e["messages"][-1]["content"].split()[1].split(".")[0]) + 1 for e in second.entries()}
    assert asked == set(range(1, 13)) - done_lines  # finished conversations were not asked again
    stats = json.loads((out / "chat" / "stats.json").read_text())
    assert stats["resumed"] == len(before) and stats["done"] == 12 and stats["complete"]
    assert stats["this_run"]["requests"] == 12 - len(before)
    assert "already done" in rerun.stderr
    assert f"(+{len(before)} kept from an earlier run)" in rerun.stderr, rerun.stderr[-1500:]
    # The accounting is in the log too, with this run's numbers.
    assert re.search(rf"this run {12 - len(before)} requests \(0 retries\), \d+ prompt \+ \d+ completion tokens",
                     rerun.stderr), rerun.stderr[-1500:]


def test_torn_last_line_is_cut_and_redone(tmp_path):
    settings = {"backend": "openai", "model": "m", "temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "seed": 0}
    good = {"id": "a", "messages": [], "source": {"file": "f", "line": 1},
            "regeneration": {**settings, "prompt_tokens": 3, "completion_tokens": 2, "turns": [{}]}}
    path = tmp_path / "regenerated.jsonl"
    path.write_bytes((json.dumps(good) + "\n").encode() + b'{"id": "b", "messa')
    log = RecordLog(path, settings)
    assert [d["id"] for d in log.done.values()] == ["a"]
    log.append({**good, "id": "b", "source": {"file": "f", "line": 2}})
    log.close()
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]


def test_s3_resume_keeps_newer_progress_from_s3_and_answers_only_this_machine_holds(tmp_path, fake_server,
                                                                                   s3_bucket, monkeypatch):
    """A retry may land on a machine whose cache is older than what another machine uploaded since, and a
    machine may hold answers it never uploaded: both are kept, so no conversation is asked for twice."""
    import yaml

    from eagle3 import storage
    from eagle3.regenerate import RegenerateConfig, regenerate

    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in conversations(6, turns=1)))
    out = f"{s3_bucket}/regen"
    remote = f"{out}/chat/regenerated.jsonl"
    server = fake_server()

    def run_on(worker: str, max_samples: int | None = None) -> dict:
        monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / worker))  # each machine its own cache
        entry = {"name": "chat", "source": "chat.jsonl", "format": "messages", "regenerate": True,
                 **({"max_samples": max_samples} if max_samples else {})}
        (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"datasets": [entry]}))
        return regenerate(RegenerateConfig(manifest=str(tmp_path / "manifest.yaml"), out=out, backend="openai",
                                           model="target", base_url=server.url, concurrency=2,
                                           max_tokens=16))["datasets"]["chat"]

    run_on("worker-a", max_samples=3)  # A's cache and S3: lines 1-3
    run_on("worker-b", max_samples=5)  # B resumes from S3: lines 1-5, uploaded
    lines = storage.read_bytes(remote).splitlines(keepends=True)
    storage.write_bytes(remote, b"".join(lines[1:]))  # S3 lacks line 1, which A's cache holds
    asked_before = len(server.entries())
    stats = run_on("worker-a")
    assert len(server.entries()) - asked_before == 1  # line 6 only
    assert (stats["resumed"], stats["done"], stats["complete"]) == (5, 6, True)
    assert [json.loads(raw)["source"]["line"] for raw in storage.read_bytes(remote).splitlines()] == [1, 2, 3, 4, 5, 6]


def test_s3_resume_drops_a_stale_cache_but_keeps_a_restart_not_uploaded_yet(tmp_path, s3_bucket):
    from eagle3 import storage
    from eagle3.regenerate.output import fetch_previous

    old = {"backend": "openai", "model": "m", "temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "seed": 0}
    new = {**old, "temperature": 0.7}

    def jsonl(*made: tuple[int, dict]) -> str:
        return "".join(json.dumps({
            "id": f"c{i}", "messages": [], "original_messages": [{"role": "user", "content": f"q{i}"}],
            "source": {"file": "f", "line": i},
            "regeneration": {**settings, "prompt_tokens": 1, "completion_tokens": 1, "turns": [{}]}}) + "\n"
            for i, settings in made)

    out, local = f"{s3_bucket}/regen", tmp_path / "cache"
    local.mkdir()
    cached, remote = local / "regenerated.jsonl", f"{s3_bucket}/regen/chat/regenerated.jsonl"
    # This machine's cache holds the old settings' answers, S3 the new ones' (a restart elsewhere): S3's are kept.
    cached.write_text(jsonl((1, old), (2, old)))
    storage.write_text(remote, jsonl((1, new)))
    fetch_previous(local, out, "chat", new)
    assert [(r["id"], r["regeneration"]["temperature"]) for r in read_jsonl(cached)] == [("c1", 0.7)]
    # A restart here with the new settings, killed before its upload: S3's old answers are the ones replaced.
    cached.write_text(jsonl((2, new)))
    storage.write_text(remote, jsonl((1, old), (3, old)))
    fetch_previous(local, out, "chat", new)
    assert [(r["id"], r["regeneration"]["temperature"]) for r in read_jsonl(cached)] == [("c2", 0.7)]
