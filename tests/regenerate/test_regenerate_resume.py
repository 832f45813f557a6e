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
    assert list(log.done) == ["a"]
    log.append({**good, "id": "b", "source": {"file": "f", "line": 2}})
    log.close()
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]
