"""Progress lines: rate, ETA, and a projected total when only an upper bound is known."""

from __future__ import annotations

import logging

from eagle3.progress import Progress


def test_upper_bound_total_is_projected_from_samples_done(caplog):
    caplog.set_level(logging.INFO, logger="t")
    p = Progress("regenerate[x]", total_samples=10, total_tokens=10 * 128, every_s=0,
                 logger=logging.getLogger("t"), tokens_are_upper_bound=True)
    p.update(samples=5, tokens=250)  # 50 tokens per sample, not the 128 allowed
    assert "250/~500 tokens (50.0%)" in caplog.text
    p.update(samples=5, tokens=250)
    p.finish()
    assert caplog.records[-1].getMessage().startswith("regenerate[x]: 10/10 samples, 500 tokens,")
    assert "done in" in caplog.text and "done; ETA" not in caplog.text


def test_exact_total_is_kept(caplog):
    caplog.set_level(logging.INFO, logger="t")
    p = Progress("extract", total_samples=4, total_tokens=1000, every_s=0, logger=logging.getLogger("t"))
    p.update(samples=1, tokens=100)
    assert "100/1000 tokens (10.0%)" in caplog.text and "ETA" in caplog.text
