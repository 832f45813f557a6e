"""Replay one conversation through the target, turn by turn.

System, user and tool turns are kept; every assistant turn is replaced by the
target's answer to the conversation so far, and that answer (not the original)
is the context of the next turn. A conversation that ends on a user or tool
turn gets one more answer, so prompt-only datasets work too.

Tool calls: if the target calls different tools than the original assistant
did, the original tool results that follow no longer belong to its answer, so
the conversation is cut after that turn and the record says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from eagle3.regenerate.conversations import Conversation

# What a request carries of a message: reasoning stays out of the context, as chat templates drop it too.
_REQUEST_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass
class Completion:
    """One answer from a backend, with the server's token accounting."""

    content: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    attempts: int = 1  # HTTP attempts it took (1 = no retry)
    token_ids: list[int] | None = None  # the generated ids, where the backend has them (hf); not stored


class RequestFailed(Exception):
    """A request that kept failing after all retries (or cannot succeed)."""

    def __init__(self, reason: str, attempts: int = 1):
        super().__init__(reason)
        self.reason, self.attempts = reason, attempts


Complete = Callable[[list[dict[str, Any]], "list[dict] | None"], Awaitable[Completion]]


@dataclass
class Replayed:
    messages: list[dict[str, Any]]
    turns: list[dict[str, Any]] = field(default_factory=list)  # per generated turn: index, tokens, finish
    truncated: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(t["prompt_tokens"] for t in self.turns)

    @property
    def completion_tokens(self) -> int:
        return sum(t["completion_tokens"] for t in self.turns)

    @property
    def attempts(self) -> int:
        return sum(t["attempts"] for t in self.turns)


def _request_view(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: msg[k] for k in _REQUEST_KEYS if k in msg}


def _tool_names(calls: list[dict] | None) -> list[str]:
    return [str((c.get("function") or {}).get("name")) for c in (calls or [])]


def _answer(c: Completion, original: dict[str, Any] | None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.reasoning_content:
        msg["reasoning_content"] = c.reasoning_content
    if c.tool_calls:
        calls = [dict(call) for call in c.tool_calls]
        # Same tools as the original: reuse its call ids so the following tool turns still pair up.
        if original and _tool_names(original.get("tool_calls")) == _tool_names(calls):
            for call, old in zip(calls, original["tool_calls"]):
                if old.get("id"):
                    call["id"] = old["id"]
        msg["tool_calls"] = calls
    return msg


async def replay(conv: Conversation, complete: Complete, answer_trailing: bool = True) -> Replayed:
    """Regenerate every assistant turn of ``conv``; RequestFailed propagates (the caller records it)."""
    out: list[dict[str, Any]] = []
    result = Replayed(messages=out)

    async def generate(index: int, original: dict[str, Any] | None) -> dict[str, Any]:
        c = await complete([_request_view(m) for m in out], conv.tools)
        result.turns.append({"index": index, "prompt_tokens": c.prompt_tokens,
                             "completion_tokens": c.completion_tokens, "finish_reason": c.finish_reason,
                             "attempts": c.attempts})
        return _answer(c, original)

    for i, msg in enumerate(conv.messages):
        if msg["role"] != "assistant" or not any(m["role"] == "user" for m in out):
            out.append(dict(msg))  # an assistant turn before any user turn has nothing to answer: kept
            continue
        new = await generate(i, msg)
        out.append(new)
        if _tool_names(msg.get("tool_calls")) != _tool_names(new.get("tool_calls")):
            result.truncated = (f"turn {i}: the target called tools {_tool_names(new.get('tool_calls'))} "
                                f"where the original called {_tool_names(msg.get('tool_calls'))}; "
                                "later turns dropped")
            return result
    if answer_trailing and out[-1]["role"] in ("user", "tool"):
        out.append(await generate(len(out), None))
    return result
