"""kill -9 at many points of tokenize, merge, extract, train and export (real `eagle3 <stage>` subprocesses).

For each stage: a reference run (in the test process) logs every kill point it reaches ($EAGLE3_KILL_LOG; eagle3.storage.kill_point:
each atomic publish, each tokenize batch, merge bucket, extract batch); then, into the same folder, a chain
of runs each SIGKILLs itself at one of those points ($EAGLE3_KILL_AT=*:k), each resuming what the last one
left. After every kill, what the stage's readers would accept must be whole (equal to the reference) or
refused. The last run, not killed, must leave byte-identical artifacts (bit-identical weights for train)
and no temporary file behind. 15 kills; ~80 s of CPU in the subprocesses, mostly importing torch/transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eagle3 import storage

REPO = Path(__file__).resolve().parents[2]
KILLS = 3  # kill points per stage (spread over the points its reference run reached); merge, cheap, gets more


def _env(tmp: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TMPDIR=str(tmp / "tmpdir"))
    for k in ("EAGLE3_KILL_AT", "EAGLE3_KILL_LOG"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(tmp: Path, stage: str, args: list[str], **env) -> subprocess.CompletedProcess:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    t0, cpu0 = time.monotonic(), _child_cpu_s()
    done = subprocess.run([sys.executable, "-m", "eagle3.cli", stage, *args], cwd=REPO, env=_env(tmp, **env),
                          capture_output=True, text=True, timeout=300)
    print(f"{stage} {sorted(env)} rc={done.returncode} wall {time.monotonic() - t0:.1f}s cpu {_child_cpu_s() - cpu0:.1f}s")
    return done


def _reference(stage: str, args: list[str], log: Path) -> None:
    """The uninterrupted run, in this process (no second torch import), on one thread as the subprocesses."""
    import torch

    from eagle3.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ[storage.KILL_LOG_ENV] = str(log)
    t0 = time.process_time()
    try:
        assert main([stage, *args]) == 0
    finally:
        os.environ.pop(storage.KILL_LOG_ENV)
        torch.set_num_threads(threads)
    print(f"{stage} reference in-process cpu {time.process_time() - t0:.1f}s")


def _child_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes, the measured extraction rates (eagle3/rates.py: timings, not artifacts) left out."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != "rates"}


def _litter(*roots: Path) -> list[str]:
    return [str(p) for r in roots if r.exists() for p in r.rglob("*") if p.name.endswith(storage.TMP_SUFFIX)]


def _picks(n_points: int, kills: int) -> list[int]:
    """``kills`` kill indices spread over 1..n_points (the first and last included)."""
    return sorted({int(round(x)) for x in np.linspace(1, n_points, min(kills, n_points))})


def kill_chain(tmp: Path, stage: str, args: list[str], out: Path, accepted, comparable=lambda f: f,
               kills: int = KILLS) -> dict:
    """Reference run (in this process), then a chain of killed runs into the same ``out``, then a clean one; returns the
    reference's files. ``accepted(out, ref)`` asserts what a reader would take from a killed run's folder
    is whole; ``comparable`` maps the files to what must be byte-identical."""
    log = tmp / f"{stage}-points.log"
    _reference(stage, args, log)
    ref = _files(out)
    points = log.read_text().split()
    assert len(points) >= 3, points
    shutil.rmtree(out)
    killed, finished = [], False
    for k in _picks(len(points), kills):
        run = _run(tmp, stage, args, EAGLE3_KILL_AT=f"*:{k}")
        if run.returncode == 0:  # a resumed run had fewer points left than k: it finished, the clean run
            finished = True
            break
        assert run.returncode == -signal.SIGKILL, (k, run.returncode, run.stderr[-3000:])
        killed.append(k)
        accepted(out, ref)
    assert len(killed) >= 2, f"{stage}: only {killed} of the points {points} were killed"
    if not finished:
        done = _run(tmp, stage, args)
        assert done.returncode == 0, done.stderr[-3000:]
    assert comparable(_files(out)) == comparable(ref), f"{stage}: resumed artifacts differ after kills at {killed}"
    assert not _litter(out, tmp / "tmpdir"), _litter(out, tmp / "tmpdir")
    return ref


def _conversation(rng, i: int) -> dict:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    q = " ".join(rng.choice(words, rng.integers(3, 12)))
    a = " ".join(rng.choice(words, rng.integers(4, 30)))
    return {"messages": [{"role": "user", "content": f"{i}: {q}?"}, {"role": "assistant", "content": a}]}


def _without_timing(files: dict) -> dict:
    """stats.json records how long the run took and whether it reused: everything else must be equal."""
    out = {}
    for name, data in files.items():
        if name.endswith("stats.json"):
            d = json.loads(data)
            d.pop("seconds", None)
            d.pop("reused", None)
            data = json.dumps(d, sort_keys=True).encode()
        out[name] = data
    return out


def _tokenize_accepted(prep: Path, ref: dict) -> None:
    """What merge would read (tokenized.parquet, checked against stats.json) is whole: every published file equals the
    reference's, and a folder with its commit marker (fingerprint.json) has all of them."""
    from eagle3.tokenize.stage import FILES, check_tokenized

    got = _without_timing(_files(prep))
    want = _without_timing(ref)
    for name, data in got.items():
        if not name.endswith(storage.TMP_SUFFIX) and "/." not in name:
            assert data == want[name], name
    for ds in (p for p in prep.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (ds / "fingerprint.json").exists():
            assert all((ds / f).exists() for f in FILES)
        if (ds / "stats.json").exists() and (ds / "tokenized.parquet").exists():  # what merge reads
            check_tokenized(str(ds))


def _merge_accepted(merged: Path, ref: dict) -> None:
    """manifest.json is the commit marker: with it, train.parquet is the reference's; the gate's checksum
    check refuses anything else."""
    if (merged / "manifest.json").exists():
        assert (merged / "train.parquet").read_bytes() == ref["train.parquet"]
        assert (merged / "manifest.json").read_bytes() == ref["manifest.json"]


def _extract_accepted(store_root: Path, ref: dict) -> None:
    """Every shard an index lists is whole and equals the reference's (a prefix of the plan); train's check
    passes on what is there."""
    from eagle3.extract.store import HiddenStateStore

    if not list(store_root.glob("*/store.json")):
        return
    store = HiddenStateStore(str(store_root))
    assert store.verify() == []
    key = Path(store.uri).name
    for shard in store.shards:
        assert (Path(store.uri) / shard).read_bytes() == ref[f"{key}/{shard}"], shard
    if len(store):
        store.check()


def _train_accepted(ckpt: Path, ref: dict) -> None:
    """The step a resume or export would take is complete and bit-identical to the reference's."""
    from eagle3 import checkpoint

    step_dir = checkpoint.latest_step_dir(str(ckpt)) if ckpt.exists() else None
    if step_dir is None:
        return
    name = Path(step_dir).name
    for f in ("model.safetensors", "optimizer.safetensors"):
        assert (Path(step_dir) / f).read_bytes() == ref[f"{name}/{f}"], (name, f)


def _export_accepted(draft: Path, ref: dict) -> None:
    """evaluate's check refuses an incomplete draft or takes the reference's weights."""
    from eagle3.errors import InputError
    from eagle3.export import check_draft

    try:
        check_draft(str(draft))
    except InputError:
        return
    assert (draft / "model.safetensors").read_bytes() == ref["model.safetensors"]


def _train_comparable(files: dict) -> dict:
    """Weights, optimizer state and every checkpoint's train state; metrics.jsonl holds wall-clock rates."""
    return {k: v for k, v in files.items() if k.endswith(".safetensors") or k.endswith("latest.json")}


@pytest.mark.slow
def test_kill_points_of_every_stage_resume_to_identical_artifacts(tmp_path, tiny_llama_dir):
    rng = np.random.default_rng(3)
    for name, n in (("alpha", 24), ("beta", 16)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps(_conversation(rng, i)) + "\n")
    (tmp_path / "m.yaml").write_text("datasets:\n  - {name: alpha, source: alpha.jsonl, format: messages}\n"
                                     "  - {name: beta, source: beta.jsonl, format: messages}\n")
    prep, merged, store = tmp_path / "prep", tmp_path / "merged", tmp_path / "store"
    vocab, ckpt, draft = tmp_path / "vocab", tmp_path / "ckpt", tmp_path / "draft"

    kill_chain(tmp_path, "tokenize", ["--manifest", str(tmp_path / "m.yaml"), "--tokenizer", tiny_llama_dir,
                                      "--out", str(prep), "--batch-size", "8"],
               prep, _tokenize_accepted, _without_timing)
    kill_chain(tmp_path, "merge", ["--prepared", str(prep), "--out", str(merged), "--max-seq-len", "48",
                                   "--seed", "7", "--bucket-mb", "0.002"], merged, _merge_accepted, kills=6)
    assert _run(tmp_path, "vocab", ["--merged", str(merged), "--out", str(vocab),
                                    "--draft-vocab-size", "64"]).returncode == 0
    kill_chain(tmp_path, "extract", ["--merged", str(merged), "--model", tiny_llama_dir, "--out", str(store),
                                     "--device", "cpu", "--token-budget", "256", "--shard-mb", "0.03"],
               store, _extract_accepted)
    kill_chain(tmp_path, "train", ["--store", str(store), "--vocab", str(vocab), "--out", str(ckpt),
                                   "--model", tiny_llama_dir, "--ttt-length", "2", "--token-budget", "128",
                                   "--grad-accum", "1", "--lr", "3e-3", "--max-steps", "4", "--log-every", "1",
                                   "--save-every", "1", "--keep", "100", "--eval-every", "0", "--init", "random",
                                   "--device", "cpu", "--precision", "float32"],
               ckpt, _train_accepted, _train_comparable)
    kill_chain(tmp_path, "export", ["--checkpoint", str(ckpt), "--out", str(draft)], draft, _export_accepted)


@pytest.mark.slow
def test_a_corrupted_shard_is_refused_by_train_and_re_extracted(tmp_path, tiny_llama_dir, monkeypatch):
    """Checksums on read: train refuses a flipped byte in a shard (naming it and the repair), and the next
    extract run re-extracts exactly that shard, byte-identical to the original."""
    from tests.extract.extract_testdata import make_samples, write_merged

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))  # this test's verified marks only
    merged = write_merged(tmp_path / "m", make_samples(24, seed=5))
    from eagle3.extract import ExtractConfig, extract

    cfg = ExtractConfig(merged=merged, model=tiny_llama_dir, out=str(tmp_path / "store"), device="cpu",
                        token_budget=256, shard_mb=0.03)
    extract(cfg)  # in this process: no second torch import
    ref = _files(tmp_path / "store")
    shard = sorted((tmp_path / "store").glob("*/shard-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))

    from eagle3.errors import InputError
    from eagle3.extract.store import HiddenStateStore

    from eagle3.train import TrainConfig
    from eagle3.train.inputs import load_inputs
    from tests.train.vocab_files import write_vocab

    vocab_dir = write_vocab(tmp_path / "vocab", list(range(3, 67)), 49152)
    train_cfg = TrainConfig(store=str(tmp_path / "store"), vocab=str(vocab_dir), out=str(tmp_path / "ckpt"),
                            model=tiny_llama_dir, device="cpu")
    with pytest.raises(InputError, match=f"{shard.name}: sha256 .* re-run `eagle3 extract`"):
        load_inputs(train_cfg)  # what train does before its first step
    assert extract(cfg)["shards_repaired"] == [shard.name]
    assert _files(tmp_path / "store") == ref
    HiddenStateStore(str(tmp_path / "store")).check()
    assert len(load_inputs(train_cfg).train_ids) > 0
