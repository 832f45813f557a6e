"""Ordered writes on one background thread, so encoding overlaps the next batch's work.

pyarrow's Parquet encoder releases the GIL: on two cores, merge and tokenize spend
about a third of their time there, which this moves off the critical path.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_DONE = object()


class BackgroundWriter:
    """Calls ``write(item)`` for each ``put(item)``, in order, on one thread.

    At most ``depth`` items wait (bounded memory). A failed write is raised by the
    next ``put`` or by ``close``; later items are then skipped. Use as a context
    manager: leaving it waits for every write.
    """

    def __init__(self, write: Callable[[Any], None], depth: int = 2, name: str = "writer"):
        self._write, self._error = write, None
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if self._error is None:
                try:
                    self._write(item)
                except BaseException as e:  # handed to the caller's thread
                    self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, item: Any) -> None:
        self._raise()
        self._queue.put(item)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_DONE)
            self._thread.join()
        self._raise()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the caller already failed: stop the thread, keep the caller's error
            self._queue.put(_DONE)
            self._thread.join()
