"""BackgroundWriter: ordered writes off the caller's thread, errors handed back."""

from __future__ import annotations

import threading
import time

import pytest

from eagle3.background import BackgroundWriter


def test_writes_in_order_on_another_thread_and_waits_at_close():
    seen, threads = [], set()

    def write(item):
        time.sleep(0.002)
        seen.append(item)
        threads.add(threading.current_thread().name)

    with BackgroundWriter(write, depth=2, name="w") as bg:
        for i in range(20):
            bg.put(i)
    assert seen == list(range(20)) and threads == {"w"}


def test_a_failed_write_is_raised_to_the_caller_and_later_items_are_skipped():
    seen = []

    def write(item):
        if item == 3:
            raise OSError("disk full")
        seen.append(item)

    bg = BackgroundWriter(write, depth=1)
    with pytest.raises(OSError, match="disk full"):
        for i in range(10):
            bg.put(i)
        bg.close()
    assert seen == [0, 1, 2]
    with pytest.raises(OSError):
        bg.close()  # still reported, the thread is gone


def test_caller_error_stops_the_thread_and_keeps_the_callers_error():
    bg = BackgroundWriter(lambda item: None)
    with pytest.raises(KeyError):
        with bg:
            bg.put(1)
            raise KeyError("caller")
    assert not bg._thread.is_alive()
