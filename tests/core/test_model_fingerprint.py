"""The target's fingerprint (what keys the hidden-state store) is hashed once per machine and unchanged weights,
also for an s3 target, whose local mirror keeps only what the prefix holds."""

from __future__ import annotations

import json

from eagle3 import storage, target


def _model(folder):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    return folder


def _counting(monkeypatch) -> list:
    calls = []
    real = target.fingerprint_files

    def counted(paths):
        calls.append(len(paths))
        return real(paths)

    monkeypatch.setattr(target, "fingerprint_files", counted)
    return calls


def test_a_local_model_is_hashed_once_and_again_when_its_weights_change(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    calls = _counting(monkeypatch)
    model = _model(tmp_path / "m")
    first = target.model_fingerprint(str(model))
    assert target.model_fingerprint(str(model)) == first and len(calls) == 1
    assert not (model / ".eagle3_fingerprint.json").exists()  # nothing written into the model folder
    (model / "model.safetensors").write_bytes(b"other" * 100)
    assert target.model_fingerprint(str(model)) != first and len(calls) == 2


def test_an_s3_model_mirror_is_not_hashed_again_by_every_task(tmp_path, s3_bucket, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    model = _model(tmp_path / "m")
    prefix = f"{s3_bucket}/models/m"
    for f in model.iterdir():
        storage.put_file(f, f"{prefix}/{f.name}")
    calls = _counting(monkeypatch)
    fps = {target.model_fingerprint(target.resolve_model(prefix)) for _ in range(3)}  # each task mirrors again
    assert len(fps) == 1 and len(calls) == 1
