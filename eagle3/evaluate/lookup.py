"""Prompt lookup (PLD, Saxena 2023; vLLM's `ngram` method): propose what followed the context's last bigram in
the prompt. The project decoder's `proposer: lookup+draft` puts it in front of the draft at every chain step
(eagle3/evaluate/spec_decode.py), and bench/copy_bench.py simulates the same rule teacher-forced."""

from __future__ import annotations

from typing import Sequence

PROPOSERS = ("draft", "lookup+draft")
"""draft: the EAGLE-3 draft proposes every token; lookup+draft: a prompt lookup hit wins, the draft fills the rest."""


def prompt_lookup(prompt: Sequence[int], a: int, b: int) -> int | None:
    """The token after the latest occurrence of the bigram (a, b) in ``prompt``; None when it does not occur
    (or only at the prompt's end, with nothing after it)."""
    for j in range(len(prompt) - 2, 0, -1):
        if prompt[j - 1] == a and prompt[j] == b:
            return prompt[j + 1]
    return None
