"""Temporary entries: named for their owner, removed on errors, swept after a kill, never under a live run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from eagle3 import storage


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_dead_owners_entries_and_keeps_live_and_young_unknown_ones(tmp_path):
    host = storage.tmp_prefix("x").split("-")[-1].rstrip(".")
    dead = tmp_path / f".shard-0of1-00001.safetensors.{_dead_pid()}-{host}.abc123.tmp"
    dead.write_bytes(b"half")
    dead_dir = tmp_path / f".step-00000004.{_dead_pid()}-{host}.q1w2e3.tmp"
    (dead_dir / "sub").mkdir(parents=True)
    (dead_dir / "sub" / "model.safetensors").write_bytes(b"x")
    live = tmp_path / f"{storage.tmp_prefix('index-0of1.json')}zz9.tmp"  # this process: alive
    live.write_bytes(b"{}")
    other_host = tmp_path / f".train.{_dead_pid()}-0123abcd.r4t5.tmp"  # an owner we cannot check
    other_host.write_bytes(b"y")
    old_style = tmp_path / ".manifest.json.k3j4l5.tmp"  # no owner in the name, old
    old_style.write_bytes(b"z")
    os.utime(old_style, (time.time() - 2 * storage.STALE_TMP_AGE_S,) * 2)
    artifact = tmp_path / "index-0of1.json"
    artifact.write_bytes(b"{}")

    removed = storage.sweep_tmp(tmp_path)
    assert sorted(os.path.basename(p) for p in removed) == sorted([dead.name, dead_dir.name, old_style.name])
    assert live.exists() and other_host.exists() and artifact.exists()
    assert storage.sweep_tmp(tmp_path, max_age_s=0) == [str(other_host)]  # once old enough, unknown owners go


def test_atomic_file_leaves_nothing_on_error_and_names_its_owner(tmp_path):
    seen = []
    with pytest.raises(RuntimeError):
        with storage.atomic_file(tmp_path / "train.parquet") as tmp:
            seen.append(tmp.name)
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert seen[0].startswith(storage.tmp_prefix("train.parquet")) and seen[0].endswith(storage.TMP_SUFFIX)
    assert list(tmp_path.iterdir()) == []


def test_kill_point_sigkills_at_the_nth_matching_point_and_logs_every_point(tmp_path):
    code = ("from eagle3 import storage\n"
            "for i in range(5):\n"
            "    storage.kill_point('extract:batch')\n"
            "    storage.write_text(r'%s/f' + str(i), 'x')\n") % tmp_path
    env = dict(os.environ, PYTHONPATH=os.getcwd(), EAGLE3_KILL_AT="publish:3", EAGLE3_KILL_LOG=str(tmp_path / "log"))
    proc = subprocess.run([sys.executable, "-c", code], env=env)
    assert proc.returncode == -9
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("f")) == ["f0", "f1"]
    assert (tmp_path / "log").read_text().split() == ["extract:batch", "publish:f0", "extract:batch", "publish:f1",
                                                      "extract:batch", "publish:f2"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the kill left f2's temp file
    storage.sweep_tmp(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
