"""Render conversations with the tokenizer's own chat template and build exact loss masks.

How (fast and template-agnostic):

1. ``probe_template`` renders a few sentinel conversations once per tokenizer to learn
   the assistant header (the generation prompt, e.g. ``<|im_start|>assistant\\n``), the
   end-of-turn text (the tail after an assistant message up to and including its first
   special token, e.g. ``<|im_end|>``; no special token -> the tail without trailing
   whitespace), and whether the template renders ``tools``, ``tool_calls``,
   ``reasoning_content`` and ``tool`` messages.
2. Each conversation is rendered ONCE. Its assistant spans are found in the text with a
   cursor walk over the messages (so a user quoting ``Assistant:`` cannot fool it): the
   span runs from the end of the assistant header to the end of the end-of-turn text,
   so it covers whatever the template renders as the model's output (``<think>``
   blocks, ``<tool_call>`` JSON) and nothing of the header or the newline after.
3. All texts of a batch go through the Rust tokenizer's ``encode_batch`` (no special
   tokens added); ``char_to_token`` at the span edges turns char spans into token
   ranges, and numpy turns those into masks. A token is 1 when any of its characters
   is inside a span.

Templates that ignore tools, tool calls or reasoning (the bundled SmolLM2 ChatML one)
would silently lose them, so the messages are rewritten first, Hermes style: reasoning
becomes ``<think>\\n...\\n</think>\\n\\n`` before the content, each tool call a
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` block after it (both
inside the assistant span, so both are learned), the tool list a ``<tools>`` block in
the system prompt, and ``tool`` messages ``<tool_response>`` blocks in a user turn.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from eagle3.datasets.readers import Conversation
from eagle3.errors import InputError

_S = "Qz7"  # sentinel prefix: plain letters, so templates that strip or trim keep it


@dataclass(frozen=True)
class TemplateInfo:
    """What ``probe_template`` learned about a chat template."""

    assistant_header: str
    end_of_turn: str
    renders_tools: bool
    renders_tool_calls: bool
    renders_reasoning: bool
    renders_tool_role: bool
    turn_start: str = ""
    """The special token a header starts with (``<|im_start|>``), or "" (plain-word headers).
    An assistant span never contains it: if it does, the turn ended some other way."""


class TemplateError(Exception):
    """A conversation the template cannot render, or whose assistant turns cannot be found."""


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str, **extra: Any) -> dict:
    return {"role": "assistant", "content": text, **extra}


def _special_tokens(tokenizer) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(tok, "special", False):
            specials.add(str(tok))
    return sorted((s for s in specials if s), key=len, reverse=True)


def _end_of_turn(tail: str, specials: list[str]) -> str:
    hits = [(tail.find(s), -len(s), s) for s in specials if s in tail]
    if hits:
        pos, _, tok = min(hits)
        return tail[:pos + len(tok)]
    return tail.rstrip() or tail


def _assistant_header(prompt: str, before_answer: str) -> str:
    """The longest head of the generation prompt that the template writes between a user turn and the answer.

    Usually the whole prompt (``<|im_start|>assistant\\n``). Some prompts pre-fill the start of
    the answer (Qwen3.5: ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``) that an
    earlier turn does not show: the header is then the role part, and the think block,
    where a turn has one, is inside the assistant span (the model writes it)."""
    for k in range(len(prompt), 0, -1):
        if prompt[:k] in before_answer:
            return prompt[:k]
    return ""


def probe_template(render: Callable[..., str], specials: list[str]) -> TemplateInfo:
    """Learn header, end-of-turn and feature support of ``render(messages, tools, add_generation_prompt)``."""
    u1, a1, u2, a2 = f"{_S}userone", f"{_S}answerone", f"{_S}usertwo", f"{_S}answertwo"
    try:
        base = render([_user(u1)], None, False)
        with_prompt = render([_user(u1)], None, True)
        full = render([_user(u1), _assistant(a1), _user(u2), _assistant(a2)], None, False)
    except Exception as e:  # noqa: BLE001 - any template failure is reported the same way
        raise InputError(f"the chat template fails on a plain user/assistant conversation: {e}") from None
    if not with_prompt.startswith(base) or len(with_prompt) == len(base):
        raise InputError("the chat template has no generation prompt (add_generation_prompt=True adds nothing), "
                         "so the assistant header cannot be found; use a template that supports it")
    for sentinel in (u1, a1, u2, a2):
        if sentinel not in full:
            raise InputError(f"the chat template drops message content ({sentinel!r} not rendered)")
    header = _assistant_header(with_prompt[len(base):], full[full.index(u1) + len(u1):full.index(a1)])
    second = full.find(header, full.index(u2) + len(u2)) if header.strip() else -1
    if second < 0 or second > full.index(a2):
        raise InputError(f"the generation prompt {with_prompt[len(base):]!r} does not appear before the "
                         f"assistant's messages in the rendered conversation {full!r}")
    eot = _end_of_turn(full[full.index(a2) + len(a2):], specials)
    if not full[full.index(a1) + len(a1):].startswith(eot):
        raise InputError(f"end-of-turn {eot!r} after the last assistant turn differs from the one after earlier turns")

    def renders(messages, tools, needle, then_header_before=None) -> bool:
        """``needle`` is rendered (and, if given, ``header`` comes between it and ``then_header_before``)."""
        try:
            text = render(messages, tools, False)
        except Exception:  # noqa: BLE001 - a template that refuses the feature does not render it
            return False
        if needle not in text:
            return False
        if then_header_before is None:
            return True
        at = text.find(header, text.index(needle) + len(needle))
        return 0 <= at < text.find(then_header_before)

    call = {"type": "function", "function": {"name": f"{_S}fn", "arguments": {f"{_S}arg": 1}}}
    tool = {"type": "function", "function": {"name": f"{_S}fn", "description": f"{_S}tooldesc",
                                             "parameters": {"type": "object", "properties": {}}}}
    return TemplateInfo(
        assistant_header=header,
        end_of_turn=eot,
        turn_start=next((t for t in specials if header.startswith(t)), ""),
        renders_tools=renders([_user(u1), _assistant(a1)], [tool], f"{_S}tooldesc"),
        renders_tool_calls=renders([_user(u1), _assistant("", tool_calls=[call])], None, f"{_S}arg"),
        renders_reasoning=renders([_user(u1), _assistant(a1, reasoning_content=f"{_S}think")], None, f"{_S}think"),
        # Native tool turns count only if the answer after them gets the usual header
        # (DeepSeek-R1 writes it as `<｜tool▁outputs▁end｜>answer`); else they become user turns.
        renders_tool_role=renders([_user(u1), _assistant("", tool_calls=[call]),
                                   {"role": "tool", "content": f"{_S}result", "tool_call_id": "c0"},
                                   _assistant(a2)], None, f"{_S}result", a2),
    )


def _tools_block(tools: list[dict]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
            "\n</tool_call>")


def _call_block(call: dict) -> str:
    fn = call["function"]
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False) + \
        "\n</tool_call>"


def adapt_messages(conv: Conversation, info: TemplateInfo) -> tuple[list[dict], list[dict] | None]:
    """Rewrite what the template would drop (tools, tool calls, reasoning, tool turns) into text it renders."""
    tools = conv.tools
    out: list[dict] = []
    for m in conv.messages:
        m = dict(m)
        if m["role"] == "assistant":
            if m.get("tool_calls") and not info.renders_tool_calls:
                blocks = "\n".join(_call_block(c) for c in m.pop("tool_calls"))
                m["content"] = f"{m['content']}\n{blocks}" if m["content"] else blocks
            if "reasoning_content" in m:
                if info.renders_reasoning:
                    m["thinking"] = m["reasoning_content"]  # some templates (gpt-oss) read this name
                else:
                    m["content"] = f"<think>\n{m.pop('reasoning_content')}\n</think>\n\n{m['content']}"
        elif m["role"] == "tool" and not info.renders_tool_role:
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if tools and not info.renders_tools:
        block = _tools_block(tools)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
        tools = None
    return out, tools


def assistant_spans(text: str, messages: list[dict], info: TemplateInfo) -> list[tuple[int, int]]:
    """Char spans [start, end) of every assistant turn in the rendered ``text``."""
    header, eot = info.assistant_header, info.end_of_turn
    spans, cursor = [], 0
    for m in messages:
        content = m["content"].strip()
        if m["role"] != "assistant":
            at = text.find(content, cursor) if content else -1
            if at >= 0:  # skip past it, so its text cannot look like a header
                cursor = at + len(content)
            continue
        at = text.find(header, cursor)
        if at < 0:
            raise TemplateError(f"assistant header {header!r} not found after char {cursor}")
        start = after = at + len(header)
        if content:
            c = text.find(content, start)
            if c >= 0:
                after = c + len(content)
        end = text.find(eot, after)
        if end < 0:
            raise TemplateError(f"end-of-turn {eot!r} not found after char {after}")
        cursor = end + len(eot)
        if info.turn_start and info.turn_start in text[start:cursor]:
            raise TemplateError(f"an assistant turn has no {eot!r} before the next {info.turn_start!r} "
                                "(does the template end some turns differently?)")
        spans.append((start, cursor))
    return spans


@dataclass
class Batch:
    """Token ids and masks of several samples, flat, with ``offsets`` [n+1]."""

    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # uint8 [T]
    offsets: np.ndarray    # int64 [n+1]


def _token_range(enc, a: int, b: int) -> tuple[int, int] | None:
    """Tokens [first, last] holding any char of [a, b); chars without a token (trimmed spaces) are skipped."""
    first = last = None
    for c in range(a, b):
        first = enc.char_to_token(c)
        if first is not None:
            break
    for c in range(b - 1, a - 1, -1):
        last = enc.char_to_token(c)
        if last is not None:
            break
    return None if first is None or last is None else (first, last)


def masks_from_spans(encodings, spans: list[list[tuple[int, int]]]) -> Batch:
    """Flatten ``encode_batch`` output and mark the tokens inside the char spans."""
    lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    offsets = np.zeros(len(encodings) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=int(offsets[-1]))
    starts, stops = [], []
    for k, (enc, sample_spans) in enumerate(zip(encodings, spans)):
        base = int(offsets[k])
        for a, b in sample_spans:
            r = _token_range(enc, a, b)
            if r is not None:
                starts.append(base + r[0])
                stops.append(base + r[1] + 1)
    edges = np.zeros(len(ids) + 1, dtype=np.int32)
    np.add.at(edges, np.asarray(starts, dtype=np.int64), 1)
    np.add.at(edges, np.asarray(stops, dtype=np.int64), -1)
    mask = (np.cumsum(edges[:-1]) > 0).astype(np.uint8)
    return Batch(input_ids=ids, loss_mask=mask, offsets=offsets)


def ramp_chunk_sizes(batch_size: int, first: int = 64):
    """Chunk sizes for ``encode_pipelined``: 64, 128, ... up to ``batch_size``, then ``batch_size``.

    Nothing encodes until the first chunk is rendered; a small first chunk gets the
    encoder going sooner (rendering 1024 conversations first measured ~0.07 s of
    wall time per 3000 in bench/tokenize_bench.py)."""
    size = max(1, min(first, batch_size))
    while True:
        yield size
        size = min(2 * size, batch_size)


class ChatMasker:
    """Render + mask conversations for one tokenizer (an HF fast tokenizer)."""

    def __init__(self, tokenizer, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        template = chat_template or tokenizer.chat_template
        named = template if isinstance(template, dict) else {}  # additional_chat_templates/*.jinja beside the default
        if named:
            if "default" not in named:
                raise InputError(f"the tokenizer has named chat templates ({', '.join(sorted(named))}) and none "
                                 "is 'default', the one a serving engine renders a chat request with: add "
                                 "chat_template.jinja to the model folder")
            template = named["default"]
        self.template = template
        if not self.template:
            raise InputError("the tokenizer has no chat template; give one or use the 'tokenized' format")
        # transformers and vLLM render a request that carries tools with the "tool_use" template where there is one
        self.tool_use = ChatMasker(tokenizer, named["tool_use"]) if "tool_use" in named else None
        self.template_sha = hashlib.sha256(
            (self.template + (self.tool_use.template if self.tool_use else "")).encode()).hexdigest()[:16]
        self._render_kwargs = {k: getattr(tokenizer, k, None) for k in
                               ("bos_token", "eos_token", "pad_token", "unk_token")}
        self._compiled = self._compile()
        self.info = probe_template(self._render, _special_tokens(tokenizer))

    def _compile(self):
        """The template compiled as transformers compiles it; None -> use apply_chat_template.

        Rendering through the compiled template skips apply_chat_template's per-call
        overhead (about half the render time); it is used only when it renders a
        probe conversation exactly as apply_chat_template does.
        """
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            compiled = _compile_jinja_template(self.template)
            probe = [_user(f"{_S}a"), _assistant(f"{_S}b"), _user(f"{_S}c")]
            fast = compiled.render(messages=probe, tools=None, documents=None, add_generation_prompt=True,
                                   **self._render_kwargs)
            slow = self.tokenizer.apply_chat_template(probe, chat_template=self.template, tokenize=False,
                                                      add_generation_prompt=True)
            return compiled if fast == slow else None
        except Exception:  # noqa: BLE001 - fall back to the slow, official path
            return None

    def _render(self, messages, tools, add_generation_prompt: bool) -> str:
        if self._compiled is not None:
            return self._compiled.render(messages=messages, tools=tools, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self._render_kwargs)
        return self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.template,
                                                  tokenize=False, add_generation_prompt=add_generation_prompt)

    def render(self, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its assistant char spans (raises TemplateError)."""
        if conv.tools and self.tool_use is not None:
            return self.tool_use.render(conv)
        messages, tools = adapt_messages(conv, self.info)
        try:
            text = self._render(messages, tools, False)
        except Exception as e:  # noqa: BLE001 - jinja raise_exception and friends
            raise TemplateError(f"chat template error: {e}") from None
        spans = assistant_spans(text, messages, self.info)
        last = conv.messages[-1] if conv.messages else {}
        reasoning = last.get("reasoning_content", "").strip() if last.get("role") == "assistant" else ""
        if reasoning and spans and reasoning not in text[spans[-1][0]:spans[-1][1]]:
            # Earlier turns' reasoning may be dropped (Qwen3 does), the final answer's may not:
            # the model writes it, so the draft must learn it.
            raise TemplateError("the chat template drops the reasoning of the final assistant turn (DeepSeek-R1 "
                                "templates strip <think> blocks from every turn), so it would not be learned; "
                                "use a template that renders reasoning_content, or drop the reasoning")
        return text, spans

    def encode(self, texts: list[str], spans: list[list[tuple[int, int]]]) -> Batch:
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return masks_from_spans(encodings, spans)

    def encode_pipelined(self, chunks: Iterable[tuple[list[str], list[list[tuple[int, int]]]]]) -> Iterator[Batch]:
        """``encode`` each (texts, spans) chunk, in order, in a worker thread.

        encode_batch releases the GIL, so while the worker encodes chunk k the
        caller's generator renders chunk k+1: rendering costs almost no wall time.
        """
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
            pending = None
            for texts, spans in chunks:
                submitted = pool.submit(self.encode, list(texts), list(spans))
                if pending is not None:
                    yield pending.result()
                pending = submitted
            if pending is not None:
                yield pending.result()

    def fingerprint_inputs(self) -> dict[str, Any]:
        return {"chat_template_sha256": self.template_sha, "assistant_header": self.info.assistant_header,
                "end_of_turn": self.info.end_of_turn}
