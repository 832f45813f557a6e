"""bench/copy_bench.py: the held-out stubs and the share of answer tokens outside the draft vocab."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import copy_bench  # noqa: E402
from tests.evaluate.conftest import export_draft  # noqa: E402


def test_heldout_stubs_are_new_draws_that_the_demo_corpus_does_not_hold(tmp_path):
    from eagle3.demo.corpus import write_demo_corpus

    stubs = copy_bench.heldout_stubs(40)
    assert [p.messages for p in stubs] == [p.messages for p in copy_bench.heldout_stubs(40)]  # deterministic
    assert len({p.messages[0]["content"] for p in stubs}) == 40
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" and "def " in p.messages[0]["content"]
               for p in stubs)
    # the demo's code_completion at its default seed, 3x (the most the demo writes)
    write_demo_corpus(str(tmp_path / "d"), scale=0.15, more={"code_completion": 3.0})
    lines = (tmp_path / "d" / "data" / "code_completion.jsonl").read_text().splitlines()
    asked = {json.loads(x)["messages"][0]["content"] for x in lines if x.strip().startswith("{")}
    assert len(asked) > 500
    assert not asked & {p.messages[0]["content"] for p in stubs}


def _run(monkeypatch, capsys, argv: list[str]) -> dict:
    monkeypatch.setattr(sys, "argv", ["copy_bench.py", *argv])
    copy_bench.main()
    out = capsys.readouterr().out
    return json.loads(out[: out.index("\ncopied tokens")])


@pytest.mark.slow
def test_tokens_outside_the_draft_vocab_are_counted(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    """A draft whose vocab is every target id has none outside; one of the first 16 ids (special tokens and
    single bytes, which a random target's greedy answer almost never emits) has almost all outside."""
    vocab_size = json.loads((Path(tiny_llama_dir) / "config.json").read_text())["vocab_size"]
    argv = ["--model", tiny_llama_dir, "--limit", "2", "--max-new-tokens", "12", "--prompts", "stubs"]
    whole = _run(monkeypatch, capsys, ["--draft", export_draft(tiny_llama_dir, tmp_path / "all", vd=vocab_size), *argv])
    assert whole["prompt_set"] == "stubs" and whole["prompts"] == 2
    assert sum(whole["tokens"].values()) > 0
    assert whole["outside_draft_vocab"] == {"copied": 0.0, "generated": 0.0}
    few = _run(monkeypatch, capsys, ["--draft", export_draft(tiny_llama_dir, tmp_path / "few", vd=16), *argv])
    assert few["tokens"] == whole["tokens"]  # the same answers: the target decodes alone
    shares = [few["outside_draft_vocab"][c] for c in ("copied", "generated") if few["tokens"][c]]
    assert shares and min(shares) > 0.9


def test_write_stubs_gives_evaluate_the_same_prompts(tmp_path, monkeypatch, capsys):
    from eagle3.evaluate.prompts import load_prompt_sets

    path = tmp_path / "stubs.jsonl"
    monkeypatch.setattr(sys, "argv", ["copy_bench.py", "--write-stubs", str(path), "--limit", "5"])
    copy_bench.main()
    assert capsys.readouterr().out.strip() == str(path)
    loaded = next(iter(load_prompt_sets(str(path)).values()))
    assert [p.messages for p in loaded] == [p.messages for p in copy_bench.heldout_stubs(5)]


@pytest.mark.parametrize("parallel", [False, True], ids=["chain", "p-eagle"])
def test_teacher_forced_logits_are_the_decoders_proposals(parallel):
    """The bench's one teacher-forced pass (the TTT layout) against the decoder's forward from each prefix
    (`Eagle3Draft.step` over a DraftCache: the prefix, then a chain step per true token at the next position; or
    P-EAGLE's `propose_parallel`), logits compared: an argmax hides a slot fed at the wrong position."""
    import torch

    from eagle3.draft.model import DraftCache
    from tests.draft.tiny import make_tiny_draft

    k = 3
    draft = make_tiny_draft(seed=2, parallel_drafting=parallel, mask_token_id=7).eval()
    if parallel:  # mask_hidden unlike the fresh ones, so slots fed anything else would show
        with torch.no_grad():
            draft.mask_hidden.copy_(torch.randn(draft.mask_hidden.shape, generator=torch.Generator().manual_seed(5)))
    g = torch.Generator().manual_seed(4)
    n = 14
    ids = torch.randint(0, 50, (n,), generator=g)
    aux = torch.randn(n, 3 * draft.config.hidden_size, generator=g)
    got = copy_bench.teacher_forced_logits(draft, ids.tolist(), aux, k)
    assert got.shape == (k, n, draft.config.draft_vocab_size)
    with torch.no_grad():
        for t in range(n - k - 1):
            cache, prefix = DraftCache(), torch.arange(t + 1)[None]
            if parallel:
                want = draft.propose_parallel(ids[None, 1:t + 2], aux[None, :t + 1], prefix, k, cache)[0]
            else:
                logits, hidden = draft.step(ids[None, 1:t + 2], aux[None, :t + 1], prefix, cache)
                want = [logits[0, -1]]
                for i in range(1, k):
                    logits, hidden = draft.step(ids[None, t + 1 + i: t + 2 + i], hidden[:, -1:],
                                                torch.tensor([[t + i]]), cache)
                    want.append(logits[0, -1])
                want = torch.stack(want)
            torch.testing.assert_close(got[:, t], want, rtol=1e-4, atol=1e-5, msg=f"prefix up to {t}")
