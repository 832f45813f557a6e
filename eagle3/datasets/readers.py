"""Read dataset files into conversations or token records; refuse bad lines with a reason.

The one file reader of every stage that reads a dataset (tokenize through ``read_records``,
regenerate through ``read_objects`` plus its own rules).

Formats (see docs/CONTRACTS.md): ``messages`` (OpenAI style), ``sharegpt``
(``conversations`` with ``from``/``value`` or ``role``/``content``) and
``tokenized`` (``input_ids`` + ``loss_mask``), each from .jsonl, .jsonl.gz or
.parquet. ``read_records`` yields one item per input record, in file order:
a ``Conversation``, a ``TokenRecord`` or a ``Rejected`` naming the 1-based line
(the row number for Parquet) and a short reason (``records`` checks each record
and owns the reasons). Blank JSONL lines hold no record and are skipped. A
missing, empty or unreadable file (truncated or corrupt gzip, not Parquet, a
corrupt Parquet page) is an InputError naming the file: nothing else is raised.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Any, Iterator

import numpy as np

from eagle3.errors import InputError
from eagle3.datasets.records import (INVALID_UTF8, Conversation, Reject, Rejected, TokenRecord, check_tokens,
                                     parse_conversation, parse_json_line, parse_tokens)

__all__ = ["Conversation", "Rejected", "TokenRecord", "count_records", "parse_conversation", "read_objects",
           "read_records"]


class _FastTokens:
    """simdjson for well-formed ``tokenized`` lines: it parses and copies the two integer
    arrays into numpy in C++ (6.3x faster than json.loads into Python lists plus np.asarray
    on 10K seed-format lines of ~1,000 tokens). Anything unusual returns None and the line
    takes the checked json.loads path, which words the reject reason."""

    def __init__(self):
        try:
            import simdjson
        except ImportError:  # optional speed-up; the json path gives the same records
            self.parser = None
        else:
            self.parser = simdjson.Parser()

    def __call__(self, raw: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        # as_buffer flattens nested arrays, so take only lines whose two lists are the only brackets;
        # simdjson keeps the first of duplicate keys and json the last, so take only lines with one of each
        # (a key may also be spelled with escapes, "input\u005fids": then count the parsed keys).
        if (self.parser is None or raw.count(b"[") != 2 or raw.count(b'"input_ids"') != 1
                or raw.count(b'"loss_mask"') != 1):
            return None
        try:
            doc = self.parser.parse(raw)
            try:
                if b"\\" in raw:
                    keys = list(doc.keys())
                    if keys.count("input_ids") != 1 or keys.count("loss_mask") != 1:
                        return None
                ids = np.frombuffer(doc["input_ids"].as_buffer(of_type="i"), np.int64)
                mask = np.frombuffer(doc["loss_mask"].as_buffer(of_type="i"), np.int64)
            finally:
                del doc  # the parser may only be reused once no document refers to it
        except Exception:  # bad JSON, UTF-8, types, keys: the slow path says which
            return None
        return ids, mask


_READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip: BadGzipFile is an OSError, truncation an EOFError


def _unreadable(e: Exception, path: str, display: str, line: int) -> InputError:
    """The whole file is refused: a stream that cannot be read to its end has lost records."""
    where = f" after line {line}" if line else ""
    if path.lower().endswith(".gz"):
        return InputError(f"cannot read as gzip{where}: {e}; the file is truncated or corrupt (test it with "
                          "`gzip -t`, then copy or compress it again)", file=display)
    return InputError(f"cannot read{where}: {e}", file=display)


def _jsonl_lines(path: str, display: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of each non-blank line."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    line = 0
    try:
        with opener(path, "rb") as f:
            for line, raw in enumerate(f, 1):
                if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark (Windows editors) is not part of the record
                if raw.strip():
                    yield line, raw
    except _READ_ERRORS as e:
        raise _unreadable(e, path, display, line) from None


def _jsonl_objects(path: str, display: str) -> Iterator[tuple[int, Any]]:
    """(line, parsed object or Reject) for each non-blank line."""
    for line, raw in _jsonl_lines(path, display):
        yield line, _json_line(raw)


def _json_line(raw: bytes) -> Any:
    try:
        return parse_json_line(raw)
    except Reject as r:
        return r


def _jsonl_tokens(path: str, display: str, vocab_size: int | None) -> Iterator[tuple[int, Any]]:
    """Like _jsonl_objects for ``tokenized`` lines, but well-formed ones come back as a
    ready TokenRecord (or Reject) through the simdjson path."""
    fast = _FastTokens()
    for line, raw in _jsonl_lines(path, display):
        arrays = fast(raw)
        if arrays is None:
            yield line, _json_line(raw)
            continue
        try:
            yield line, check_tokens(arrays[0], arrays[1], line, vocab_size)
        except Reject as r:
            yield line, r


def _parquet_file(path: str, display: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as e:  # ValueError: a column name that is not UTF-8
        raise InputError(f"not a readable Parquet file: {e}", file=display) from None


def _batch_rows(batch) -> list[Any]:
    """The rows of a record batch as Python values. A string that is not UTF-8 (Arrow does
    not check on read) fails the whole batch, so then rows are converted one by one and
    that row alone is rejected."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        rows: list[Any] = []
        for k in range(batch.num_rows):
            try:
                rows.append(batch.slice(k, 1).to_pylist()[0])
            except UnicodeDecodeError as e:
                rows.append(Reject(INVALID_UTF8, f"a string column holds bytes that are not UTF-8: {e.reason}"))
        return rows


def _parquet_objects(path: str, display: str) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    pf = _parquet_file(path, display)
    line, batches = 0, pf.iter_batches(batch_size=4096)
    while True:
        try:
            batch = next(batches, None)
            rows = [] if batch is None else _batch_rows(batch)
        except (pa.ArrowException, OSError, ValueError) as e:  # corrupt pages, unsupported types
            raise InputError(f"Parquet data cannot be read after row {line}: {e}", file=display) from None
        if batch is None:
            break
        for row in rows:
            line += 1
            yield line, row
    if line != pf.metadata.num_rows:
        raise InputError(f"the Parquet footer says {pf.metadata.num_rows} rows but {line} were read; "
                         "the file is corrupt", file=display)


def count_records(path: str, display: str | None = None) -> int:
    """Records in the file, counted cheaply for a progress ETA: newlines for JSONL (at least 1),
    the footer's row count for Parquet. An unreadable file is an InputError naming ``display``."""
    display = display or path
    if path.lower().endswith(".parquet"):
        return _parquet_file(path, display).metadata.num_rows
    opener = gzip.open if path.lower().endswith(".gz") else open
    n = 0
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                n += block.count(b"\n")
    except _READ_ERRORS as e:
        raise _unreadable(e, path, display, 0) from None
    return max(n, 1)


def read_objects(path: str, fmt: str, display: str | None = None,
                 vocab_size: int | None = None) -> Iterator[tuple[int, Any]]:
    """(1-based line, record) for each record of the local file ``path``, in file order (``display``
    names it in errors). A record is the parsed JSON object or Parquet row, a ``Reject`` when the line
    is not JSON, or (``tokenized`` JSONL lines on the fast path) a checked ``TokenRecord``/``Reject``.

    Raises InputError for a missing or empty file, one that cannot be read to its end, or one that
    holds no record.
    """
    display = display or path
    if not os.path.isfile(path):
        raise InputError("file does not exist; check the manifest's source", file=display)
    if os.path.getsize(path) == 0:
        raise InputError("file is empty; remove the dataset from the manifest or fill it", file=display)
    if path.lower().endswith(".parquet"):
        objects = _parquet_objects(path, display)
    elif fmt == "tokenized":
        objects = _jsonl_tokens(path, display, vocab_size)
    else:
        objects = _jsonl_objects(path, display)
    seen = 0
    for line, obj in objects:
        seen += 1
        yield line, obj
    if seen == 0:
        raise InputError("file holds no records (only blank lines or no rows)", file=display)


def read_records(path: str, fmt: str, display: str | None = None,
                 vocab_size: int | None = None) -> Iterator[Conversation | TokenRecord | Rejected]:
    """Yield one item per record of the local file ``path`` (``display`` names it in errors): a
    Conversation with an assistant turn (``parse_conversation``), a TokenRecord, or a Rejected.

    Raises InputError as ``read_objects`` does.
    """
    for line, obj in read_objects(path, fmt, display, vocab_size):
        try:
            if isinstance(obj, Reject):
                raise obj
            if isinstance(obj, TokenRecord):
                yield obj
            elif fmt == "tokenized":
                yield parse_tokens(obj, line, vocab_size)
            else:
                yield parse_conversation(obj, fmt, line)
        except Reject as r:
            # A detail may quote the input, lone surrogates included; rejects.jsonl is written as UTF-8.
            yield Rejected(line, r.reason, r.detail.encode("utf-8", "backslashreplace").decode("utf-8"))
