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
                 tokens_are_upper_bound: bool = False):
        self.stage = stage
        # Generation only knows max_tokens per sample: project the total from the samples done instead.
        self.tokens_are_upper_bound = tokens_are_upper_bound
        self.total_samples = total_samples
        self.total_tokens = max(total_tokens, 1)
        self.every_s = every_s
        self.samples = 0
        self.tokens = 0
        self.start = time.monotonic()
        self._last = 0.0
        self.log = logger or log

    def update(self, samples: int, tokens: int, force: bool = False) -> None:
        self.samples += samples
        self.tokens += tokens
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            self.log.info(self.line())

    def expected_tokens(self) -> int:
        if self.tokens_are_upper_bound and self.samples and self.total_samples:
            projected = round(self.tokens / self.samples * self.total_samples)
            return max(min(projected, self.total_tokens), self.tokens, 1)
        return self.total_tokens

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.tokens / elapsed
        total = self.expected_tokens()
        left = (total - self.tokens) / rate if rate > 0 else float("inf")
        eta = fmt_duration(left) if left != float("inf") else "?"
        approx = "~" if self.tokens_are_upper_bound else ""
        return (
            f"{self.stage}: {self.samples}/{self.total_samples} samples, "
            f"{self.tokens}/{approx}{total} tokens ({100 * self.tokens / total:.1f}%), "
            f"{rate:,.0f} tok/s, elapsed {fmt_duration(elapsed)}, ETA {eta}"
        )

    def finish(self) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        self.log.info(f"{self.stage}: {self.samples}/{self.total_samples} samples, {self.tokens} tokens, "
                      f"{self.tokens / elapsed:,.0f} tok/s, done in {fmt_duration(elapsed)}")
