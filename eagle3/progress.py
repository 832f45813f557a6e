"""Progress lines with rate and ETA for long stages."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("eagle3.progress")


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Logs `stage: done/total samples, tokens/s, ETA` at most every `every_s` seconds.

    >>> p = Progress("extract", total_samples=100, total_tokens=50_000)
    >>> p.update(samples=10, tokens=5_000)   # logs when due
    >>> p.finish()
    """

    def __init__(self, stage: str, total_samples: int, total_tokens: int, every_s: float = 10.0, logger=None,
                 tokens_are_upper_bound: bool = False, kept: int = 0):
        self.stage = stage
        # Samples an earlier run finished (a resumed or re-run stage): named, so "0/0 samples" on a re-run
        # does not read as an empty dataset.
        self.kept = kept
        # Generation only knows max_tokens per sample: project the total from the samples done instead.
        self.tokens_are_upper_bound = tokens_are_upper_bound
        self.total_samples = total_samples
        self.total_tokens = max(total_tokens, 1)
        self.every_s = every_s
        self.samples = 0
        self.tokens = 0
        self.start = time.monotonic()
        self._last = 0.0
        # (time, tokens) at the first update with work done: the rate is measured from there on. Before it,
        # the time is start-up and, for batched or concurrent work, a batch in flight; a rate over that
        # reads "1 tok/s, ETA 2h29m" for a task that takes a minute.
        self._first: tuple[float, int] | None = None
        self.log = logger or log

    def update(self, samples: int, tokens: int, force: bool = False) -> None:
        self.samples += samples
        self.tokens += tokens
        now = time.monotonic()
        if self._first is None and self.tokens > 0:
            self._first = (now, self.tokens)
        if force or now - self._last >= self.every_s:
            self._last = now
            self.log.info(self.line())

    def expected_tokens(self) -> int:
        if self.tokens_are_upper_bound and self.samples and self.total_samples:
            projected = round(self.tokens / self.samples * self.total_samples)
            return max(min(projected, self.total_tokens), self.tokens, 1)
        return self.total_tokens

    def rate(self) -> float | None:
        """Tokens per second since the first update that did work; None until a later one did more."""
        if self._first is None:
            return None
        t0, n0 = self._first
        dt, dn = time.monotonic() - t0, self.tokens - n0
        return dn / dt if dn > 0 and dt > 0 else None

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        total = self.expected_tokens()
        rate = self.rate()
        if rate is None:
            speed = "measuring the rate (after the first batch)"
        else:
            speed = f"{rate:,.0f} tok/s, ETA {fmt_duration(max(total - self.tokens, 0) / rate)}"
        approx = "~" if self.tokens_are_upper_bound else ""
        return (
            f"{self.stage}: {self._samples()}, "
            f"{self.tokens}/{approx}{total} tokens ({100 * self.tokens / total:.1f}%), "
            f"elapsed {fmt_duration(elapsed)}, {speed}"
        )

    def _samples(self) -> str:
        kept = f" (+{self.kept} kept from an earlier run)" if self.kept else ""
        return f"{self.samples}/{self.total_samples} samples{kept}"

    def finish(self) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        if not self.total_samples and self.kept:
            self.log.info(f"{self.stage}: nothing to do, {self.kept} samples kept from an earlier run")
            return
        self.log.info(f"{self.stage}: {self._samples()}, {self.tokens} tokens, "
                      f"{self.tokens / elapsed:,.0f} tok/s, done in {fmt_duration(elapsed)}")
