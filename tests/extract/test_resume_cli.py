"""Real subprocesses of `python -m eagle3.cli extract`: SIGKILL + resume, and OOM exit 75 + adapted retry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from eagle3.errors import GpuOutOfMemory, InputError
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore

from extract_testdata import REPO, cli_env, make_samples, run_cli, tree_bytes, write_merged


def _args(merged, model, out, *extra):
    return ["--merged", merged, "--model", model, "--out", str(out), "--device", "cpu",
            "--token-budget", "256", "--shard-mb", "0.03", *extra]


def _index_entries(out: Path) -> int:
    found = list(out.glob("*/index-0of1.json"))
    if not found:
        return 0
    try:
        return len(json.loads(found[0].read_text()))
    except ValueError:
        return 0  # caught mid-rename: cannot happen with atomic writes, but never fail the poll on it


def _kill_when(proc, out: Path, shards: int, extra_s: float = 0.0, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while _index_entries(out) < shards:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "extraction made no progress"
        time.sleep(0.05)
    time.sleep(extra_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_then_rerun_is_byte_identical(tmp_path, tiny_llama_dir):
    merged = write_merged(tmp_path / "m", make_samples(40, seed=7))
    ref = run_cli(_args(merged, tiny_llama_dir, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    total_shards = _index_entries(tmp_path / "ref")
    assert total_shards >= 6

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "eagle3.cli", "extract", *_args(merged, tiny_llama_dir, out)]
    env = cli_env(EAGLE3_EXTRACT_SLOW_SHARD_S="0.4")
    # kill 1: while the second shard is being prepared; kill 2: ~mid-way through a later one
    for shards, extra in ((1, 0.0), (3, 0.25)):
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _kill_when(proc, out, shards, extra)
    killed_at = _index_entries(out)
    assert 3 <= killed_at < total_shards

    done = run_cli(_args(merged, tiny_llama_dir, out))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["shards_written"] == total_shards - killed_at  # only the remaining shards
    assert summary["samples_skipped"] > 0 and summary["samples_skipped"] + summary["samples_extracted"] == 40
    # The progress lines name the kept samples, so a resumed task does not read as a smaller dataset.
    assert f"(+{summary['samples_skipped']} kept from an earlier run)" in done.stderr, done.stderr[-1500:]
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
    assert HiddenStateStore(str(out)).verify() == []


def _oom_args(merged, model, out, budget="256"):
    return _args(merged, model, out) + ["--shard-mb", "1", "--token-budget", budget]


def test_oom_below_one_sample_is_refused_not_retried(tmp_path, tiny_llama_dir):
    # 20-token samples at budget 32: half (16) cannot hold the longest sample, so the retry gets one sample's
    # budget (20); where even that runs out of memory, no retry can help
    merged = write_merged(tmp_path / "m", make_samples(6, seed=8, min_len=20, max_len=20))
    run = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "s", budget="32"), EAGLE3_INJECT_OOM_ABOVE_TOKENS=10)
    assert run.returncode == GpuOutOfMemory.EXIT_CODE, run.stderr
    adapt = next((tmp_path / "s").glob("*/adapt-0of1.json"))
    assert json.loads(adapt.read_text())["token_budget"] == 20
    run = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "s", budget="32"), EAGLE3_INJECT_OOM_ABOVE_TOKENS=10)
    assert run.returncode == InputError.EXIT_CODE != GpuOutOfMemory.EXIT_CODE, run.stderr
    assert "which holds just the longest sample (20 tokens)" in run.stderr
    assert json.loads(adapt.read_text())["token_budget"] == 20  # nothing smaller for a retry to adopt


def test_oom_exits_75_then_retry_uses_the_halved_budget(tmp_path, tiny_llama_dir):
    # equal lengths: full batches of 12x20 = 240 padded tokens at budget 256, 6x20 at 128
    merged = write_merged(tmp_path / "m", make_samples(30, seed=8, min_len=20, max_len=20))
    first = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "s"), EAGLE3_INJECT_OOM_ABOVE_TOKENS=200)
    assert first.returncode == 75, first.stderr
    assert "out of memory" in first.stderr
    adapt_file = next((tmp_path / "s").glob("*/adapt-0of1.json"))
    adapt = json.loads(adapt_file.read_text())
    assert adapt["token_budget"] == 128 and adapt["previous_token_budget"] == 256
    assert adapt["asked"] == 256 and adapt["device"] == "cpu"
    # kept for this budget on this device only: a retry on another device starts from the budget asked
    adapt_file.write_text(json.dumps({**adapt, "device": "NVIDIA H200 140 GiB"}))
    elsewhere = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "s"), EAGLE3_INJECT_OOM_ABOVE_TOKENS=200)
    assert elsewhere.returncode == 75 and "taken as asked" in elsewhere.stderr, elsewhere.stderr[-2000:]
    assert json.loads(adapt_file.read_text())["device"] == "cpu"  # and the halving is recorded for this one

    second = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "s"), EAGLE3_INJECT_OOM_ABOVE_TOKENS=200)
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["token_budget"] == 128 and summary["samples_extracted"] == 30

    # the same bytes as a clean run at the budget the retry adopted...
    clean = run_cli(_oom_args(merged, tiny_llama_dir, tmp_path / "clean", budget="128"))
    assert clean.returncode == 0, clean.stderr
    assert tree_bytes(tmp_path / "s") == tree_bytes(tmp_path / "clean")
    # ...and the same samples/shards as a run that never hit the OOM (values to float tolerance:
    # other batch shapes change fp32 summation order)
    extract(ExtractConfig(merged=merged, model=tiny_llama_dir, out=str(tmp_path / "big"), device="cpu",
                          token_budget=256, shard_mb=1))
    a, b = HiddenStateStore(str(tmp_path / "s")), HiddenStateStore(str(tmp_path / "big"))
    assert a.sample_ids() == b.sample_ids()
    assert {k: v["sample_ids"] for k, v in a.shards.items()} == {k: v["sample_ids"] for k, v in b.shards.items()}
    for sid in a.sample_ids():
        assert torch.allclose(a.get(sid)["aux"].float(), b.get(sid)["aux"].float(), rtol=1e-2, atol=1e-2)
