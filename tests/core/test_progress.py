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
    assert "100/1000 tokens (10.0%)" in caplog.text


def test_no_eta_until_a_rate_is_measured(caplog, monkeypatch):
    """The first batch's time includes start-up and the batch in flight: no rate from it; from the first
    batch on, the rate is what the later batches took."""
    import eagle3.progress as progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="t")
    p = Progress("regenerate[x]", total_samples=4, total_tokens=400, every_s=0, logger=logging.getLogger("t"))
    now[0] = 60.0  # the first batch done after a minute of start-up
    p.update(samples=1, tokens=100)
    first = caplog.records[-1].getMessage()
    assert "ETA" not in first and "tok/s" not in first and "measuring the rate" in first
    now[0] = 70.0
    p.update(samples=1, tokens=100)  # 100 tokens in the 10 s since the first batch: 10 tok/s, 200 left
    assert caplog.records[-1].getMessage().endswith("10 tok/s, ETA 0m20s")


def test_samples_kept_by_an_earlier_run_are_named(caplog):
    """A re-run's own work is 0/0 when an earlier run did it all: the lines say so instead of reading as an
    empty dataset."""
    caplog.set_level(logging.INFO, logger="t")
    p = Progress("regenerate[chat]", total_samples=2, total_tokens=200, every_s=0, logger=logging.getLogger("t"),
                 kept=43)
    p.update(samples=1, tokens=100)
    assert "regenerate[chat]: 1/2 samples (+43 kept from an earlier run), 100/200 tokens" in caplog.text
    p.update(samples=1, tokens=100)
    p.finish()
    assert caplog.records[-1].getMessage().startswith("regenerate[chat]: 2/2 samples (+43 kept from an earlier run), "
                                                      "200 tokens,")
    nothing = Progress("regenerate[chat]", total_samples=0, total_tokens=0, logger=logging.getLogger("t"), kept=45)
    nothing.finish()
    assert caplog.records[-1].getMessage() == "regenerate[chat]: nothing to do, 45 samples kept from an earlier run"
    fresh = Progress("extract", total_samples=1, total_tokens=10, every_s=0, logger=logging.getLogger("t"))
    fresh.update(samples=1, tokens=10)
    assert "kept" not in caplog.records[-1].getMessage()
