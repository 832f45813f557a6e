"""The verify gate: re-check a merged dataset before any GPU time is spent; MERGED/verify.json.

``verify(VerifyConfig) -> verify.json content``; raises GateFailed when a check fails (never retried).
The checks are listed in :mod:`eagle3.verify.stage`.
"""

from eagle3.verify.config import VerifyConfig


def verify(cfg: VerifyConfig) -> dict:
    """Run every check, write MERGED/verify.json, raise GateFailed if one fails; returns verify.json."""
    from eagle3.verify.stage import run

    return run(cfg)


__all__ = ["VerifyConfig", "verify"]
