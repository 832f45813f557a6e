"""τ and per-position acceptance on hand-made traces."""

from __future__ import annotations

import pytest

from eagle3.acceptance import (
    accept_length_histogram, accept_rate_by_position, acceptance_length, simulated_acceptance_length,
)


def trace(*accepts, k=3):
    return [{"drafted": k, "accepted": a, "emitted": a + 1} for a in accepts]


def test_tau_counts_the_bonus_token():
    assert acceptance_length(trace(0, 0, 0)) == 1.0  # every draft rejected: 1 token per verification
    assert acceptance_length(trace(3, 3)) == 4.0  # all accepted: k + 1
    assert acceptance_length(trace(0, 1, 2, 3)) == pytest.approx(2.5)
    assert acceptance_length([]) == 0.0


def test_tau_uses_emitted_when_a_stop_cuts_the_round():
    steps = trace(2, 2) + [{"drafted": 3, "accepted": 1, "emitted": 1}]  # eos was the accepted draft
    assert acceptance_length(steps) == pytest.approx((3 + 3 + 1) / 3)


def test_accept_rate_is_conditional_on_reaching_the_position():
    steps = trace(0, 1, 1, 3)
    # pos 1: reached 4, accepted 3; pos 2: reached 3 (a>=1), accepted 1; pos 3: reached 1, accepted 1
    assert accept_rate_by_position(steps, 3) == [0.75, pytest.approx(1 / 3), 1.0]


def test_accept_rate_skips_positions_not_drafted_and_never_reached():
    steps = trace(1, 1, k=3) + [{"drafted": 1, "accepted": 1, "emitted": 2}]
    # the k=1 round reached only position 1; nobody reached position 3
    assert accept_rate_by_position(steps, 3) == [1.0, 0.0, None]


def test_histogram_and_simulated_length():
    assert accept_length_histogram(trace(0, 1, 1, 3), 3) == [1, 2, 0, 1]
    assert simulated_acceptance_length([1.0, 1.0, 1.0]) == 4.0
    assert simulated_acceptance_length([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert simulated_acceptance_length([]) == 1.0


def test_prompt_counts_reduce_a_trace_hand_computed():
    from eagle3.acceptance import prompt_counts, rates_of, tau_of

    # k=3: accept 3 (+bonus), accept 0, accept 1, and a final round drafting only 1 token and accepting it.
    steps = [{"drafted": 3, "accepted": 3, "emitted": 4}, {"drafted": 3, "accepted": 0, "emitted": 1},
             {"drafted": 3, "accepted": 1, "emitted": 2}, {"drafted": 1, "accepted": 1, "emitted": 2}]
    c = prompt_counts(steps, 3)
    assert c == {"verifications": 4, "emitted": 9, "reached": [4, 2, 1], "accepted": [3, 1, 1]}
    assert tau_of([c]) == 9 / 4 and rates_of([c]) == [3 / 4, 1 / 2, 1.0]
    # the same figures as the trace functions
    assert tau_of([c]) == acceptance_length(steps) and rates_of([c]) == accept_rate_by_position(steps, 3)


def test_bootstrap_interval_holds_the_point_and_shrinks_with_more_prompts():
    from eagle3.acceptance import bootstrap_intervals

    def prompts(n):
        return [{"verifications": 10, "emitted": 15 + (i % 5), "reached": [10], "accepted": [5 + i % 5]}
                for i in range(n)]

    few, many = bootstrap_intervals(prompts(5)), bootstrap_intervals(prompts(80))
    for r in (few, many):
        lo, hi = r["tau_interval"]
        assert lo <= r["tau"] <= hi
    assert (many["tau_interval"][1] - many["tau_interval"][0]) < (few["tau_interval"][1] - few["tau_interval"][0])


def test_paired_agreement_flags_a_real_shift_and_not_noise():
    from eagle3.acceptance import paired_agreement

    base = [{"verifications": 20, "emitted": 30 + (i * 7) % 11, "reached": [20], "accepted": [8 + (i * 7) % 11]}
            for i in range(20)]
    same = [dict(c) for c in base]
    noisy = [dict(c, emitted=c["emitted"] + (1 if i % 2 else -1)) for i, c in enumerate(base)]
    shifted = [dict(c, emitted=c["emitted"] - 3, accepted=[c["accepted"][0] - 3]) for c in base]  # τ lower by 0.15
    assert paired_agreement(base, same)["agree"] and paired_agreement(base, noisy)["tau"]["agree"]
    report = paired_agreement(base, shifted)
    assert not report["agree"] and report["tau"]["difference"] == pytest.approx(0.15)
    assert report["tau"]["interval"][0] > 0


def test_vocab_reach_counts_the_answer_tokens_the_draft_vocab_lacks():
    from eagle3.acceptance import vocab_reach

    # 7 answer tokens over two answers; 3, 9 and 9 are outside {1, 2, 5}
    reach = vocab_reach([[1, 3, 2], [9, 5, 9, 1]], frozenset({1, 2, 5}))
    assert reach == {"tokens": 7, "outside": 3, "share_outside": pytest.approx(3 / 7), "draft_vocab_size": 3}
    assert vocab_reach([], frozenset({1}))["share_outside"] == 0.0
