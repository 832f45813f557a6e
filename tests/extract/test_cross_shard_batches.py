"""Batches cut over the whole task, not inside shards: the store stays the one small batches write, and a resume,
a repair or an out-of-memory retry still writes the uninterrupted run's bytes; a served engine keeps its requests
in flight across batches.

The tiny Llama's states depend on the batch they were computed in (other shapes, other summation orders: a
bf16-stored value moves by a rounding step), so byte equality across runs holds only where the same batches ran.
``per_sample`` forwards one sample at a time instead, for the tests that compare stores cut into other batches.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from eagle3.errors import GpuOutOfMemory
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore, StoreWriter

from extract_testdata import make_samples, tree_bytes, write_merged

pytestmark = pytest.mark.precision
SHARD_MB = 0.03  # 60 tokens of the tiny model (bf16, H=64: 517 bytes/token): shards of 1-6 samples


def _cfg(merged, model, out, **kw):
    return ExtractConfig(merged=merged, model=model, out=str(out),
                         **{"device": "cpu", "shard_mb": SHARD_MB, "progress_every_s": 0, **kw})


def _store_dir(out: Path) -> Path:
    return next(out.glob("*/store.json")).parent


def _index(out: Path) -> dict:
    return json.loads((_store_dir(out) / "index-0of1.json").read_text())


@pytest.fixture
def per_sample(monkeypatch):
    """The tiny model's forward one sample at a time (no batch changes a bit of its states); returns the padded
    size of every batch the stage forwarded."""
    from eagle3.extract import capture

    padded = []

    class PerSample(capture.TargetCapture):
        def forward(self, seqs, sample_ids=None):
            padded.append(len(seqs) * max(len(s) for s in seqs))
            outs = [super(PerSample, self).forward([s]) for s in seqs]
            return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]), [len(s) for s in seqs]

    monkeypatch.setattr(capture, "TargetCapture", PerSample)
    return padded


def test_batches_cross_shards_and_the_store_is_the_one_small_batches_write(tmp_path, tiny_llama_dir, per_sample):
    """Batches up to the budget, several shards each; the shards (names, bytes, samples) and their index entries
    are those of a run whose batches hold one sample each (what batches cut inside shards also gave)."""
    merged = write_merged(tmp_path / "m", make_samples(40, seed=11))
    big = extract(_cfg(merged, tiny_llama_dir, tmp_path / "big", token_budget=1024))
    shard_tokens = int(SHARD_MB * 2**20) // big["bytes_per_token"]
    assert max(per_sample) > 4 * shard_tokens  # batches cut inside shards stayed within one shard's tokens
    per_sample.clear()
    small = extract(_cfg(merged, tiny_llama_dir, tmp_path / "small", token_budget=1))
    assert max(per_sample) <= 48  # one sample per batch
    assert big["shards_written"] == small["shards_written"] > 10
    files = {k: v for k, v in tree_bytes(tmp_path / "big").items() if "/shard-" in k}
    assert files == {k: v for k, v in tree_bytes(tmp_path / "small").items() if "/shard-" in k}

    def entries(out):  # the batches on record differ, as they should; nothing else does
        return {k: {f: x for f, x in e.items() if f not in ("batch_sizes", "batch_offset")}
                for k, e in _index(out).items()}

    assert entries(tmp_path / "big") == entries(tmp_path / "small")
    assert any(e["batch_offset"] for e in _index(tmp_path / "big").values())  # a batch began in an earlier shard


def _interrupted(monkeypatch, after: int):
    """Make the shard writer fail after ``after`` shards (a crash with some shards written); returns the undo."""
    real, calls = StoreWriter.write_shard, [0]

    def write_shard(self, *args, **kw):
        calls[0] += 1
        if calls[0] > after:
            raise OSError("disk gone (planted)")
        return real(self, *args, **kw)

    monkeypatch.setattr(StoreWriter, "write_shard", write_shard)
    return lambda: monkeypatch.setattr(StoreWriter, "write_shard", real)


@pytest.mark.parametrize("after", [1, 4, 9])
def test_a_resumed_run_writes_the_uninterrupted_runs_bytes(tmp_path, tiny_llama_dir, monkeypatch, after):
    """The run stops with a batch open across the last shard it wrote; the next run forwards that batch again
    from its first sample (stored samples too, not stored again), so every later batch, and every byte, is the
    uninterrupted run's."""
    merged = write_merged(tmp_path / "m", make_samples(40, seed=12))
    ref = extract(_cfg(merged, tiny_llama_dir, tmp_path / "ref", token_budget=2048))
    index = _index(tmp_path / "ref")
    open_batches = [name for name, e in sorted(index.items())[:after]
                    if sum(e["batch_sizes"]) - e["batch_offset"] > e["samples"]]
    assert open_batches, "the test needs a batch that continues past a written shard"
    undo = _interrupted(monkeypatch, after)
    with pytest.raises(OSError, match="planted"):
        extract(_cfg(merged, tiny_llama_dir, tmp_path / "run", token_budget=2048))
    assert len(_index(tmp_path / "run")) == after
    undo()
    resumed = extract(_cfg(merged, tiny_llama_dir, tmp_path / "run", token_budget=2048))
    assert resumed["shards_written"] == ref["shards_written"] - after
    assert resumed["samples_skipped"] + resumed["samples_extracted"] == 40
    assert tree_bytes(tmp_path / "run") == tree_bytes(tmp_path / "ref")


def test_a_repair_forwards_the_shards_samples_in_their_recorded_batches(tmp_path, tiny_llama_dir, monkeypatch):
    """Damaged shards whose batches reach into their neighbours are re-extracted in those batches (the neighbours
    forwarded, not rewritten): the same bytes as before. (Cut anew, a shard's samples alone, 4 of these shards
    came out other bytes.)"""
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))  # this test's verified marks only
    merged = write_merged(tmp_path / "m", make_samples(40, seed=12))
    extract(_cfg(merged, tiny_llama_dir, tmp_path / "s", token_budget=2048))
    ref = tree_bytes(tmp_path / "s")
    index = _index(tmp_path / "s")
    crossing = sorted(n for n, e in index.items() if sum(e["batch_sizes"]) > e["samples"])
    assert len(crossing) > 10
    for name in crossing:
        shard = _store_dir(tmp_path / "s") / name
        data = bytearray(shard.read_bytes())
        data[-5] ^= 0xFF
        shard.write_bytes(bytes(data))
    summary = extract(_cfg(merged, tiny_llama_dir, tmp_path / "s", token_budget=2048))
    assert summary["shards_repaired"] == crossing and summary["shards_written"] == len(crossing)
    assert summary["samples_extracted"] == sum(index[n]["samples"] for n in crossing)
    assert tree_bytes(tmp_path / "s") == ref


def test_an_out_of_memory_keeps_the_shards_written_and_the_retry_fills_the_same_shards(tmp_path, tiny_llama_dir,
                                                                                      monkeypatch):
    """The wide batches at the end of the plan run out of memory: the shards finished before stay (byte for byte
    the clean run's), the budget is halved, and the retries fill the rest of the same shards (same names and
    samples; values to float tolerance: other batches)."""
    merged = write_merged(tmp_path / "m", make_samples(40, seed=12))
    clean = extract(_cfg(merged, tiny_llama_dir, tmp_path / "clean", token_budget=2048))
    monkeypatch.setenv("EAGLE3_INJECT_OOM_ABOVE_TOKENS", "200")  # the plan's batches: 24 to 238 tokens
    with pytest.raises(GpuOutOfMemory):
        extract(_cfg(merged, tiny_llama_dir, tmp_path / "s", token_budget=2048))
    kept = _index(tmp_path / "s")
    assert 0 < len(kept) < clean["shards_written"]
    ref = tree_bytes(tmp_path / "clean")
    for name in kept:
        assert (_store_dir(tmp_path / "s") / name).read_bytes() == ref[f"{_store_dir(tmp_path / 's').name}/{name}"]
    for _ in range(4):  # each retry that runs out of memory again halves once more
        try:
            summary = extract(_cfg(merged, tiny_llama_dir, tmp_path / "s", token_budget=2048))
            break
        except GpuOutOfMemory:
            continue
    assert summary["token_budget"] < 2048 and summary["samples_skipped"] == sum(e["samples"] for e in kept.values())
    a, b = HiddenStateStore(str(tmp_path / "s")), HiddenStateStore(str(tmp_path / "clean"))
    assert a.verify() == []
    assert {k: v["sample_ids"] for k, v in a.shards.items()} == {k: v["sample_ids"] for k, v in b.shards.items()}
    for sid in a.sample_ids():
        assert torch.allclose(a.get(sid)["aux"].float(), b.get(sid)["aux"].float(), rtol=2e-2, atol=2e-2)


class _Concurrency:
    """Counts the requests in flight at once."""

    def __init__(self):
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


def _fake_served(requests: _Concurrency, delay_s: float = 0.02):
    """A ServedCapture whose 'server' answers in this process: states made from the token ids alone, after
    ``delay_s`` (requests overlap only if the engine sends them together)."""
    from eagle3.extract.served import ServedCapture, remove_tree

    class Server:
        url, log_path, proc = "http://fake", "fake.log", None

        def start(self):
            pass

        def wait_healthy(self, timeout, stopped):
            pass

        def stop(self):
            pass

    class FakeServed(ServedCapture):
        engine_name, label, lm_head = "vllm", "fake vLLM", None
        engine = {"name": "vllm", "version": "fake"}
        forward_path = "fake server"

        def _new_server(self):
            return Server()

        def _one(self, ids, name):
            with requests:
                time.sleep(delay_s)
            g = torch.Generator().manual_seed(sum(ids) * 7919 + len(ids))
            return torch.randn(len(ids), 4 * self.hidden_size, generator=g)

        def _assemble(self, answers):
            states = torch.cat(answers)
            return states[:, :3 * self.hidden_size], states[:, 3 * self.hidden_size:]

        def _cleanup(self):
            remove_tree(self.work_dir)  # no server.log to keep

    return FakeServed


def test_requests_stay_in_flight_across_batches_within_the_window(tiny_llama_dir):
    """Batches of 2 samples, 8 requests in flight: the next batches' samples are sent while a batch's answers
    come in, as many as the window of tokens allows; the answers come back per batch, in order."""
    requests = _Concurrency()
    cap = _fake_served(requests)(ExtractConfig(merged="m", model=tiny_llama_dir, out="o", engine="vllm",
                                               requests_in_flight=8), "cpu", 64)
    seqs = [[3 + i] * (10 + i) for i in range(24)]
    batches = [(seqs[i:i + 2], [f"s{i}", f"s{i + 1}"]) for i in range(0, 24, 2)]
    try:
        got = list(cap.forward_batches(batches, 10_000))
        assert requests.most == 8
        for (aux, last, lengths), (b, names) in zip(got, batches):
            ref_aux, ref_last, ref_lengths = cap.forward(b, names)  # one batch alone: the same states
            assert torch.equal(aux, ref_aux) and torch.equal(last, ref_last) and lengths == ref_lengths
        requests.most = 0
        assert len(list(cap.forward_batches(batches, 40))) == 12
        assert requests.most <= 4  # the batch at hand (2 samples), and what 40 tokens allow beyond it
    finally:
        cap.close()


def test_a_served_extraction_keeps_requests_in_flight_across_batch_boundaries(tmp_path, tiny_llama_dir,
                                                                              monkeypatch):
    """Through the stage: a small budget cuts batches of 1-3 samples; the requests in flight still reach
    requests_in_flight (a pool per batch gave at most the batch's samples)."""
    from eagle3.extract import served

    requests = _Concurrency()
    monkeypatch.setattr(served, "served_capture", lambda cfg, device, longest: _fake_served(requests)(
        cfg, device, longest))
    merged = write_merged(tmp_path / "m", make_samples(40, seed=13, min_len=20, max_len=30))
    summary = extract(_cfg(merged, tiny_llama_dir, tmp_path / "s", engine="vllm", token_budget=96,
                           requests_in_flight=6, shard_mb=1))
    assert summary["samples_extracted"] == 40 and HiddenStateStore(summary["store"]).verify() == []
    assert requests.most == 6
