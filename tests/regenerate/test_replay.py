"""Conversation reading and turn-by-turn replay, with an in-memory target (no server)."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from eagle3.errors import InputError
from eagle3.regenerate.conversations import BadRecord, read_conversations, to_conversation
from eagle3.regenerate.replay import Completion, replay


class EchoTarget:
    """Answers "A<k>" where k counts the assistant turns in the context; records every context."""

    def __init__(self, tool_calls=None):
        self.contexts = []
        self.tool_calls = tool_calls

    async def complete(self, messages, tools=None):
        self.contexts.append(messages)
        k = sum(m["role"] == "assistant" for m in messages)
        return Completion(content=f"A{k}", prompt_tokens=len(messages), completion_tokens=1,
                          finish_reason="stop", reasoning_content=f"R{k}", tool_calls=self.tool_calls)


def conv(messages, **extra):
    return to_conversation(1, {"messages": messages, **extra}, "messages")


def test_each_answer_is_the_context_of_the_next_turn():
    target = EchoTarget()
    c = conv([{"role": "system", "content": "S"}, {"role": "user", "content": "U0"},
              {"role": "assistant", "content": "old0", "reasoning_content": "old thinking"},
              {"role": "user", "content": "U1"}, {"role": "assistant", "content": "old1"}])
    out = asyncio.run(replay(c, target.complete))
    assert [m["content"] for m in out.messages] == ["S", "U0", "A0", "U1", "A1"]
    assert out.messages[2]["reasoning_content"] == "R0"  # kept from the server
    # Turn 1 saw the regenerated turn 0, not the original, and no reasoning in the context.
    assert target.contexts[1][2] == {"role": "assistant", "content": "A0"}
    assert [t["index"] for t in out.turns] == [2, 4]
    assert out.prompt_tokens == 2 + 4 and out.completion_tokens == 2


def test_trailing_user_turn_is_answered_unless_disabled():
    c = conv([{"role": "user", "content": "only a prompt"}])
    assert [m["content"] for m in asyncio.run(replay(c, EchoTarget().complete)).messages] == ["only a prompt", "A0"]
    assert len(asyncio.run(replay(c, EchoTarget().complete, answer_trailing=False)).messages) == 1


def test_diverging_tool_calls_cut_the_conversation():
    c = conv([{"role": "user", "content": "weather?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
              {"role": "assistant", "content": "It is sunny."}])
    out = asyncio.run(replay(c, EchoTarget().complete))  # the target calls no tool
    assert len(out.messages) == 2 and "get_weather" in out.truncated


def test_matching_tool_calls_keep_original_ids():
    calls = [{"id": "new", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    c = conv([{"role": "user", "content": "weather?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
             tools=[{"type": "function", "function": {"name": "get_weather"}}])
    out = asyncio.run(replay(c, EchoTarget(tool_calls=calls).complete))
    assert out.truncated is None
    assert out.messages[1]["tool_calls"][0]["id"] == "call_1"
    assert out.messages[2]["role"] == "tool"


def test_sharegpt_is_normalised():
    c = to_conversation(3, {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
                        "sharegpt")
    assert c.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert c.id.startswith("L3-")


def test_bad_records_are_reported_not_raised(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    lines = [json.dumps({"messages": [{"role": "user", "content": "ok"}]}), "{not json",
             json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
             json.dumps({"messages": [{"role": "assistant", "content": "no user"}]})]
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    got = list(read_conversations(str(path), "messages"))
    assert [line for line, _ in got] == [1, 2, 3, 4]
    assert not isinstance(got[0][1], BadRecord)
    assert "not valid JSON" in str(got[1][1])
    assert "role must be one of" in str(got[2][1])
    assert "no user turn" in str(got[3][1])


def test_ids_are_stable_and_keep_duplicates_apart():
    rec = {"messages": [{"role": "user", "content": "same"}]}
    assert to_conversation(1, rec, "messages").id == to_conversation(1, dict(rec), "messages").id
    assert to_conversation(1, rec, "messages").id != to_conversation(2, rec, "messages").id
    assert to_conversation(9, {**rec, "id": "abc"}, "messages").id == "abc"


def test_tokenized_format_cannot_be_regenerated():
    with pytest.raises(InputError, match="regenerate: false"):
        to_conversation(1, {"input_ids": [1], "loss_mask": [1]}, "tokenized")
