"""Fixtures for the training tests (the helpers themselves are in train_helpers.py)."""

from __future__ import annotations

import pytest

from tests.train.train_helpers import build_store, peaked_copy


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory, tiny_llama_dir) -> dict:
    root = tmp_path_factory.mktemp("train-store")
    target = peaked_copy(tiny_llama_dir, root / "target")
    store, vocab = build_store(root, target)
    return {"store": store, "vocab": vocab, "target": target}
