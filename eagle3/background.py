"""Background threads for the data stages: ordered writes, read-ahead, hashing while writing.

pyarrow's Parquet encoder and decoder release the GIL: on two cores, merge and
tokenize spend about a third of their time encoding and a fifth decoding, which
these move off the critical path.
"""

from __future__ import annotations

import hashlib
import io
import queue
import threading
from typing import Any, Callable, Iterable, Iterator

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


def prefetch(items: Iterable, depth: int = 2, name: str = "prefetch") -> Iterator:
    """Iterate ``items`` on a background thread, ``depth`` ahead of the consumer
    (Parquet decoding releases the GIL, so reading overlaps the caller's work).
    An exception in the producer is raised at the item where it happened."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put((item, None))
        except BaseException as e:
            q.put((_DONE, e))
            return
        q.put((_DONE, None))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:  # the consumer stopped early: let the producer finish its put and leave
        stop.set()
        while thread.is_alive():
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass


class HashingFile(io.FileIO):
    """A file opened for writing that keeps the sha256 of everything written to it,
    so a manifest checksum needs no second read of a large file."""

    def __init__(self, path: str):
        super().__init__(path, "wb")
        self.sha256 = hashlib.sha256()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):  # a raw write may be partial; hash exactly what lands
            done += super().write(view[done:])
        self.sha256.update(view)
        return done
