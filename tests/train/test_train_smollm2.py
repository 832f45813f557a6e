"""The trainer on the real SmolLM2-135M: a store captured from real text, init from the target."""

from __future__ import annotations

import pytest
import torch

from tests.train.train_helpers import build_store
from eagle3.train.config import TrainConfig
from eagle3.train.loop import train
from eagle3.checkpoint import read_metrics

TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog did not move, and the fox ran into the forest.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5",
    "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy.",
    "To make tea, boil water, put a tea bag in a cup, pour the water over it and wait three minutes.",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'is even')\n    else:\n        print(i, 'is odd')",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.",
    "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen.",
    "The sun rises in the east and sets in the west. At night the moon and the stars light the sky.",
] * 3


@pytest.mark.slow
def test_draft_initialised_from_smollm2_learns(tmp_path, smollm2_dir):
    from eagle3.target import load_tokenizer

    torch.set_num_threads(2)
    tok = load_tokenizer(smollm2_dir)
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    store, vocab = build_store(tmp_path, smollm2_dir, seqs=seqs, draft_vocab=512)
    out = tmp_path / "ckpt"
    summary = train(TrainConfig(store=store, vocab=vocab, out=str(out), ttt_length=3, token_budget=4096,
                                epochs=12, lr=3e-4, log_every=1, eval_every=0, heldout_share=0.1, init="target",
                                device="cpu"))
    rows = read_metrics(str(out / "metrics.jsonl"), "train")
    assert rows[-1]["loss"] < 0.7 * rows[0]["loss"], (rows[0]["loss"], rows[-1]["loss"])
    assert rows[-1]["acc_i"][0] > rows[0]["acc_i"][0]
    assert summary["sim_accept_len"] is not None and summary["sim_accept_len"] >= 1.0
