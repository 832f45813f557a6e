"""The online source's prefetch thread (eagle3.train.online._Prefetcher) with a fake target: order, depth,
a stale schedule, and the target's error reaching the trainer."""

from __future__ import annotations

import threading
import time

import pytest

from eagle3.train.online import _Prefetcher


class FakeTarget:
    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple[str, ...]] = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def __call__(self, ids: list[str]):
        with self.lock:
            self.calls.append(tuple(ids))
        if self.fail_on in ids:
            raise RuntimeError(f"server died on {self.fail_on}")
        time.sleep(0.01)
        return [i.upper() for i in ids]


def test_scheduled_batches_are_computed_ahead_in_order_and_at_most_depth_ahead():
    target = FakeTarget()
    pre = _Prefetcher(target, depth=2)
    pre.schedule([("a",), ("b",), ("c",), ("d",)])
    time.sleep(0.2)
    assert target.calls == [("a",), ("b",)]  # two ahead, no more
    assert pre.take(("a",)) == ["A"] and pre.take(("b",)) == ["B"]
    assert pre.take(("c",)) == ["C"] and pre.take(("d",)) == ["D"]
    assert target.calls == [("a",), ("b",), ("c",), ("d",)]  # each computed once
    pre.schedule([("b",)])  # scheduled again after it was taken: computed again (a new epoch)
    assert pre.take(("b",)) == ["B"]
    pre.close()


def test_a_batch_not_scheduled_drops_the_stale_schedule_and_the_caller_computes_it():
    target = FakeTarget()
    pre = _Prefetcher(target, depth=1)
    pre.schedule([("a", "b"), ("c",)])
    assert pre.take(("b",)) is None  # e.g. a write-back made "a" stored: the schedule is stale
    pre.schedule([("c",)])
    assert pre.take(("c",)) == ["C"]
    # asking for a later scheduled batch skips the earlier ones
    pre.schedule([("x",), ("y",), ("z",)])
    assert pre.take(("z",)) == ["Z"]
    pre.close()


def test_the_targets_error_is_raised_in_the_trainers_thread():
    pre = _Prefetcher(FakeTarget(fail_on="b"), depth=2)
    pre.schedule([("a",), ("b",)])
    assert pre.take(("a",)) == ["A"]
    with pytest.raises(RuntimeError, match="server died on b"):
        pre.take(("b",))
    pre.close()
