"""The prompt-lookup proposer (`proposer: lookup+draft`): the lookup rule on hand-written prompts, the decoder with
it in front of a draft that is always wrong on a target whose greedy output is hand-computable, lossless on a real
tiny Llama, and the configuration that refuses it where an engine cannot run it."""

from __future__ import annotations

import pytest
import torch

from eagle3.errors import InputError
from eagle3.evaluate.config import EvaluateConfig
from eagle3.evaluate.decoder_bench import proposed_by
from eagle3.evaluate.lookup import prompt_lookup
from eagle3.evaluate.spec_decode import StepRecord, greedy_generate, speculative_generate
from tests.evaluate.test_spec_decode import PROMPT, OracleDraft, tiny  # noqa: F401 (the fixture)

V = 64


def test_the_lookup_takes_the_latest_earlier_occurrence():
    prompt = [5, 6, 7, 1, 5, 6, 9, 5, 6]
    assert prompt_lookup(prompt, 5, 6) == 9  # (5, 6) at 0-1 and 4-5 (and at the end, nothing after it)
    assert prompt_lookup(prompt, 6, 7) == 1
    assert prompt_lookup(prompt, 7, 5) is None
    assert prompt_lookup([], 1, 2) is None and prompt_lookup([1, 2], 1, 2) is None


class _Cache:
    def __init__(self):
        self.tokens: list[int] = []

    def get_seq_length(self) -> int:
        return len(self.tokens)

    def crop(self, minus: int) -> None:
        if minus:
            del self.tokens[minus:]


class CountingTarget:
    """A target whose greedy next token after x is (x + 1) % V: its output is known by hand."""

    def new_cache(self, rollback: bool = True):
        return _Cache()

    def forward(self, token_ids, cache, *, all_logits: bool, aux: bool):
        cache.tokens += list(token_ids)
        ids = torch.tensor(list(token_ids))
        logits = torch.nn.functional.one_hot((ids + 1) % V, V).float()
        return (logits if all_logits else logits[-1:]), torch.zeros(len(ids), 3)


def test_lookup_hits_are_accepted_where_the_draft_is_wrong():
    # The target counts up; the prompt holds 10..19 once, then ends on 11, 12: the answer 13, 14, ... 19 is a copy
    # of the prompt, and after 19 the prompt says 3 (wrong: the target says 20).
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3, 11, 12]
    target = CountingTarget()
    want = list(range(13, 13 + 12))
    assert greedy_generate(target, prompt, 12, frozenset()).tokens == want
    wrong = OracleDraft(prompt + want, correct=0)  # proposes the true token + 1: always rejected
    plain = speculative_generate(target, wrong, prompt, 12, frozenset(), steps=3)
    assert plain.tokens == want and [s.accepted for s in plain.steps] == [0] * 11
    looked = speculative_generate(target, OracleDraft(prompt + want, correct=0), prompt, 12, frozenset(), steps=3,
                                  lookup=True)
    assert looked.tokens == want
    # root 13; round 1 looks up 14 15 16 (bonus 17); round 2 looks up 18 19 and then 3 after (18, 19): 2 accepted,
    # bonus 20; then no bigram of 20.. occurs in the prompt and the always-wrong draft proposes.
    assert [(s.looked_up, s.accepted) for s in looked.steps[:3]] == [((0, 1, 2), 3), ((0, 1, 2), 2), ((), 0)]
    counts = proposed_by(looked.steps)
    assert counts["lookup"] == {"proposed": 6, "accepted": 5} and counts["draft"]["accepted"] == 0


def test_lookup_stays_lossless_on_a_real_tiny_llama(tiny):  # noqa: F811
    # The random tiny Llama falls into a 3-token loop after this prompt; with the loop's start in the prompt, its
    # greedy output is copies of prompt bigrams, which the lookup finds, while the draft is always wrong.
    loop = greedy_generate(tiny, PROMPT + PROMPT[1:], 12, frozenset()).tokens
    prompt = PROMPT + PROMPT[1:] + loop[:6]
    base = greedy_generate(tiny, prompt, 20, frozenset())
    spec = speculative_generate(tiny, OracleDraft(prompt + base.tokens, 0), prompt, 20, frozenset(), steps=3,
                                lookup=True)
    assert spec.tokens == base.tokens
    assert proposed_by(spec.steps)["lookup"]["accepted"] > 0 == proposed_by(spec.steps)["draft"]["accepted"]


def test_proposed_by_counts_accepted_lookups_before_the_first_rejection():
    steps = [StepRecord(3, 2, 3, (0, 2)), StepRecord(3, 3, 4, (1,)), StepRecord(3, 0, 1, ())]
    assert proposed_by(steps) == {"lookup": {"proposed": 3, "accepted": 2}, "draft": {"proposed": 6, "accepted": 3}}


def test_the_lookup_is_refused_where_an_engine_would_run():
    base = dict(model="m", draft="d", out="o")
    assert EvaluateConfig(**base, proposer="lookup+draft").proposer == "lookup+draft"
    with pytest.raises(InputError, match="project decoder only .* --proposer draft"):
        EvaluateConfig(**base, proposer="lookup+draft", compare_with=["vllm"])
    with pytest.raises(InputError, match="project decoder only"):
        EvaluateConfig(**base, proposer="lookup+draft", backend="vllm")
    with pytest.raises(InputError, match="proposer='ngram' is not one of draft, lookup\\+draft"):
        EvaluateConfig(**base, proposer="ngram")
