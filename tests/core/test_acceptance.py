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
