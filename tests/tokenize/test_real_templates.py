"""Loss masks on real chat templates and tokenizers (tests/tokenize/real_tokenizers.py), each
checked against an oracle that does not use the masker's cursor walk.

The oracle is hand-written per template: ``expected_outputs`` says, from the template's
source read by hand, what each assistant turn looks like in the rendering of the WHOLE
conversation (Qwen3 and Qwen3.5 drop the reasoning of turns before the last user query;
DeepSeek-R1 drops it from every turn; Llama 3.2 writes a tool call as JSON and drops the
content beside it). The oracle finds ``header + output`` for each turn in order, and a
token is expected in the loss exactly when one of its characters lies in an output.
Templates that ignore tools, tool calls or reasoning get them Hermes style
(eagle3/tokenize/chat_mask.py docstring), so the oracle writes that form for them.
"""

from __future__ import annotations

import json
import random
import zlib

import pytest
from transformers import AutoTokenizer

from eagle3.datasets.readers import parse_conversation
from eagle3.errors import InputError
from eagle3.tokenize.chat_mask import ChatMasker, TemplateError

WORDS = "alpha beta gamma delta value sum list file data model token loss 12 7 42 3.5 ( ) , . ? ! ok".split()


def _think(reasoning: str, content: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{content}"


def _hermes(m: dict) -> str:
    """The content a template that renders neither tool calls nor reasoning receives."""
    content = m["content"]
    if m.get("tool_calls"):
        blocks = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                          "arguments": c["function"]["arguments"]}) + "\n</tool_call>"
                           for c in m["tool_calls"])
        content = f"{content}\n{blocks}" if content else blocks
    return _think(m["reasoning_content"], content) if m.get("reasoning_content") else content


def _last_query(msgs: list[dict]) -> int:
    return max(i for i, m in enumerate(msgs) if m["role"] == "user")


def gemma3(msgs):
    return [_hermes(m).strip() + "<end_of_turn>" for m in msgs if m["role"] == "assistant"]


def llama3(msgs):
    out = []
    for m in msgs:
        if m["role"] == "assistant" and m.get("tool_calls"):  # content and reasoning beside a call are dropped
            fn = m["tool_calls"][0]["function"]
            out.append('{"name": "' + fn["name"] + '", "parameters": ' + json.dumps(fn["arguments"]) + "}<|eot_id|>")
        elif m["role"] == "assistant":
            out.append(_hermes(m).strip() + "<|eot_id|>")
    return out


def qwen3(msgs):
    out, lq = [], _last_query(msgs)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        content, reasoning = m["content"], m.get("reasoning_content", "")
        text = _think(reasoning.strip("\n"), content.lstrip("\n")) if i > lq and (
            i == len(msgs) - 1 or reasoning) else content
        for j, c in enumerate(m.get("tool_calls", ())):
            text += ("\n" if j or content else "") + '<tool_call>\n{"name": "' + c["function"]["name"] + \
                '", "arguments": ' + json.dumps(c["function"]["arguments"]) + "}\n</tool_call>"
        out.append(text + "<|im_end|>")
    return out


def qwen3_5(msgs):
    out, lq = [], _last_query(msgs)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        content = m["content"].strip()
        text = _think(m.get("reasoning_content", "").strip(), content) if i > lq else content
        for j, c in enumerate(m.get("tool_calls", ())):
            params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in c["function"]["arguments"].items())
            lead = "\n" if j else ("\n\n" if content else "")
            text += f"{lead}<tool_call>\n<function={c['function']['name']}>\n{params}</function>\n</tool_call>"
        out.append(text + "<|im_end|>")
    return out


def deepseek_r1(msgs):
    return [_hermes(m).split("</think>")[-1] + "<｜end▁of▁sentence｜>" for m in msgs if m["role"] == "assistant"]


TEMPLATES = {  # name -> (assistant header, oracle, renders tool messages natively in the oracle's sense)
    "gemma3": ("<start_of_turn>model\n", gemma3),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", llama3),
    "qwen3": ("<|im_start|>assistant\n", qwen3),
    "qwen3_5": ("<|im_start|>assistant\n", qwen3_5),
    "deepseek_r1": ("<｜Assistant｜>", deepseek_r1),
}
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                         "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}


def _words(rng, k, tag):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, k))) + f" {tag}"


def conversations(n: int, seed: int, reasoning_last: bool = True) -> list[dict]:
    """Random multi-turn conversations: system prompts, reasoning, tool calls and tool results."""
    rng, out = random.Random(seed), []
    for s in range(n):
        msgs = [{"role": "system", "content": _words(rng, 8, f"s{s}")}] if rng.random() < 0.5 else []
        tools = None
        for t in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": _words(rng, 12, f"u{s}x{t}")})
            if rng.random() < 0.3:
                tools = [TOOL]
                call = {"id": f"c{t}", "type": "function",
                        "function": {"name": "lookup", "arguments": {"word": rng.choice(WORDS[:8])}}}
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call],
                             **({"reasoning_content": _words(rng, 6, f"r{s}y{t}")} if rng.random() < 0.5 else {})})
                msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": _words(rng, 5, f"o{s}x{t}")})
            reply = {"role": "assistant", "content": _words(rng, 20, f"a{s}x{t}")}
            if rng.random() < 0.5:
                reply["reasoning_content"] = _words(rng, 10, f"r{s}x{t}")
            msgs.append(reply)
        if not reasoning_last:
            msgs[-1].pop("reasoning_content", None)
        out.append({"messages": msgs, **({"tools": tools} if tools else {})})
    return out


def oracle_mask(text: str, outputs: list[str], header: str, offsets) -> list[int]:
    spans, cursor = [], 0
    for out in outputs:
        at = text.find(header + out, cursor)
        assert at >= 0, f"oracle: {header + out!r} not in the rendering after char {cursor}"
        spans.append((at + len(header), at + len(header) + len(out)))
        cursor = spans[-1][1]
    return [int(any(a < e and b > s for s, e in spans)) for a, b in offsets]


@pytest.fixture(scope="module")
def maskers(real_dirs):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = ChatMasker(AutoTokenizer.from_pretrained(real_dirs(name)))
        return cache[name]
    return get


def check(masker: ChatMasker, name: str, record: dict) -> None:
    header, oracle = TEMPLATES[name]
    conv = parse_conversation(record, "messages", 1)
    text, spans = masker.render(conv)
    enc = masker.backend.encode(text, add_special_tokens=False)
    batch = masker.encode([text], [spans])
    assert batch.input_ids.tolist() == enc.ids
    expected = oracle_mask(text, oracle(conv.messages), header, enc.offsets)
    assert batch.loss_mask.tolist() == expected, (name, text)


@pytest.mark.parametrize("name", ["gemma3", "llama3", "qwen3", "qwen3_5"])
def test_masks_equal_the_oracle_on_random_conversations(maskers, name):
    masker = maskers(name)
    # crc32, not hash(): str hashes are salted per process, so a failure could not be replayed
    for record in conversations(40, seed=zlib.crc32(name.encode()) % 1000):
        try:
            check(masker, name, record)
        except TemplateError as e:  # the only refusal allowed: Llama 3.2 takes one tool call per turn
            pytest.fail(f"{name} refused {record}: {e}")


def test_deepseek_r1_masks_equal_the_oracle_without_final_reasoning(maskers):
    masker = maskers("deepseek_r1")
    assert not masker.info.renders_tool_role  # after tool outputs R1 writes no <｜Assistant｜>: they become user turns
    for record in conversations(40, seed=7, reasoning_last=False):
        check(masker, "deepseek_r1", record)


def test_deepseek_r1_refuses_a_final_turn_whose_reasoning_it_drops(maskers):
    record = {"messages": [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "content": "4.", "reasoning_content": "Add them."}]}
    with pytest.raises(TemplateError, match="drops the reasoning of the final assistant turn"):
        maskers("deepseek_r1").render(parse_conversation(record, "messages", 1))


def test_qwen3_drops_earlier_reasoning_and_keeps_the_last(maskers):
    """Hand-computed pieces of the whole rendering: turn 1 loses its reasoning because a user
    query follows it; the last turn keeps it. The mask is 1 exactly on the labelled pieces."""
    masker = maskers("qwen3")
    record = {"messages": [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "R2"}]}
    pieces = [("<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n", 0), ("A1<|im_end|>", 1),
              ("\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n", 0),
              ("<think>\nR2\n</think>\n\nA2<|im_end|>", 1), ("\n", 0)]
    text, spans = masker.render(parse_conversation(record, "messages", 1))
    assert text == "".join(p for p, _ in pieces)
    labels = []
    for piece, label in pieces:
        labels += [label] * len(masker.backend.encode(piece, add_special_tokens=False).ids)
    assert masker.encode([text], [spans]).loss_mask.tolist() == labels


def test_qwen3_5_prefilled_generation_prompt_gives_the_role_header(maskers):
    """Qwen3.5's generation prompt pre-fills an empty think block; earlier turns have none."""
    info = maskers("qwen3_5").info
    assert (info.assistant_header, info.end_of_turn) == ("<|im_start|>assistant\n", "<|im_end|>")
    assert info.renders_reasoning and info.renders_tool_calls and info.renders_tool_role


def test_probe_facts_of_the_real_templates(maskers):
    g, l3, r1 = maskers("gemma3").info, maskers("llama3").info, maskers("deepseek_r1").info
    assert (g.end_of_turn, g.renders_tool_calls, g.renders_tool_role) == ("<end_of_turn>", False, False)
    assert (l3.end_of_turn, l3.renders_tool_calls, l3.renders_tools) == ("<|eot_id|>", True, True)
    assert (r1.end_of_turn, r1.renders_reasoning) == ("<｜end▁of▁sentence｜>", False)


def test_a_template_without_generation_prompt_is_refused(real_dirs):
    tok = AutoTokenizer.from_pretrained(real_dirs("llama3"))
    no_prompt = tok.chat_template.replace("{%- if add_generation_prompt %}", "{%- if false %}")
    with pytest.raises(InputError, match="no generation prompt"):
        ChatMasker(tok, chat_template=no_prompt)
