"""Loss masks, token by token, for four chat template styles.

Each expectation is written as the rendered text cut into labelled pieces: 1 for
what the assistant generates (content, <think> block, tool call, end-of-turn
token), 0 for everything else. Encoding the pieces one by one must give the same
ids as encoding the whole text (so the cuts are token boundaries), and the mask
must equal the labels.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from eagle3.datasets.readers import parse_conversation
from eagle3.errors import InputError
from eagle3.tokenize.chat_mask import ChatMasker, TemplateError, _tools_block
import tokenize_templates as templates  # tests/tokenize/ is on sys.path (pytest rootdir-less layout)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def tool_conversation(**first_assistant) -> dict:
    return {"tools": [WEATHER_TOOL], "messages": [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL], **first_assistant},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "Sunny, 21 C.", "reasoning_content": "Report it."},
    ]}


def assert_mask(masker: ChatMasker, record: dict, pieces: list[tuple[str, int]]) -> None:
    text, spans = masker.render(parse_conversation(record, "messages", 1))
    assert text == "".join(p for p, _ in pieces)
    batch = masker.encode([text], [spans])
    ids, labels = [], []
    for piece, label in pieces:
        piece_ids = masker.backend.encode(piece, add_special_tokens=False).ids
        ids += piece_ids
        labels += [label] * len(piece_ids)
    assert batch.input_ids.tolist() == ids, "the pieces are not token boundaries"
    assert batch.loss_mask.tolist() == labels
    assert batch.offsets.tolist() == [0, len(ids)]


@pytest.fixture(scope="module")
def chatml(chatml_dir):
    return ChatMasker(AutoTokenizer.from_pretrained(chatml_dir))


def test_chatml_probe(chatml):
    info = chatml.info
    assert (info.assistant_header, info.end_of_turn) == ("<|im_start|>assistant\n", "<|im_end|>")
    # SmolLM2's template prints only role + content, so these are rewritten Hermes style.
    assert not (info.renders_tools or info.renders_tool_calls or info.renders_reasoning)
    assert info.renders_tool_role


def test_chatml_multi_turn_with_system(chatml):
    record = {"messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "2+3 = 5."}, {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "content": "20."}]}
    assert_mask(chatml, record, [
        ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
         "<|im_start|>assistant\n", 0),
        ("2+3 = 5.<|im_end|>", 1),
        ("\n<|im_start|>user\nAnd times 4?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("20.<|im_end|>", 1),
        ("\n", 0)])


def test_chatml_default_system_prompt_is_not_learned(chatml):
    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    assert_mask(chatml, record, [
        ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0),
        ("Hello!<|im_end|>", 1),
        ("\n", 0)])


def test_chatml_tools_calls_and_reasoning_are_kept_hermes_style(chatml):
    assert_mask(chatml, tool_conversation(reasoning_content="Need the tool."), [
        ("<|im_start|>system\nBe exact.\n\n" + _tools_block([WEATHER_TOOL]) + "<|im_end|>\n"
         "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", 0),
        ('<think>\nNeed the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
         "\n</tool_call><|im_end|>", 1),
        ('\n<|im_start|>tool\n{"temp": 21}<|im_end|>\n<|im_start|>assistant\n', 0),
        ("<think>\nReport it.\n</think>\n\nSunny, 21 C.<|im_end|>", 1),
        ("\n", 0)])
    assert json.dumps(WEATHER_TOOL) in _tools_block([WEATHER_TOOL])


def test_llama3_headers_and_native_tool_calls(make_tokenizer_dir):
    tok_dir = make_tokenizer_dir("llama3", templates.LLAMA3, special=templates.LLAMA3_SPECIAL,
                                 bos_token="<|begin_of_text|>")
    masker = ChatMasker(AutoTokenizer.from_pretrained(tok_dir))
    assert masker.info.assistant_header == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert masker.info.end_of_turn == "<|eot_id|>"
    assert masker.info.renders_tool_calls and not masker.info.renders_reasoning
    record = tool_conversation()
    del record["tools"], record["messages"][-1]["reasoning_content"]
    assert_mask(masker, record, [
        ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe exact.<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n", 0),
        ("\n", 0),  # followed by text, the byte-level regex splits "\n\n" into two tokens
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>', 1),
        ("<|start_header_id|>ipython<|end_header_id|>\n", 0),
        ('\n{"temp": 21}<|eot_id|>'
         "<|start_header_id|>assistant<|end_header_id|>\n", 0),
        ("\n", 0),
        ("Sunny, 21 C.<|eot_id|>", 1)])


def test_qwen3_think_blocks_and_tool_calls(make_tokenizer_dir):
    tok_dir = make_tokenizer_dir("qwen3", templates.QWEN3, added=templates.QWEN3_ADDED)
    masker = ChatMasker(AutoTokenizer.from_pretrained(tok_dir))
    info = masker.info
    assert info.renders_tools and info.renders_tool_calls and info.renders_reasoning and info.renders_tool_role
    assert_mask(masker, tool_conversation(reasoning_content="Need the tool."), [
        ("<|im_start|>system\nBe exact.\n\n# Tools\n<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools><|im_end|>\n"
         "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n", 0),
        ('<think>\nNeed the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
         "\n</tool_call><|im_end|>", 1),
        ('\n<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n', 0),
        ("<think>\nReport it.\n</think>\n\nSunny, 21 C.<|im_end|>", 1),
        ("\n", 0)])


def test_plain_word_header_not_fooled_by_user_text(make_tokenizer_dir):
    tok_dir = make_tokenizer_dir("plain", templates.PLAIN, eos_token="</s>")
    masker = ChatMasker(AutoTokenizer.from_pretrained(tok_dir))
    assert (masker.info.assistant_header, masker.info.end_of_turn) == ("Assistant:", "</s>")
    record = {"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What does Assistant: mean here?"},
        {"role": "assistant", "content": "It names the speaker."},
        {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You are welcome."}]}
    assert_mask(masker, record, [
        ("Answer briefly.\n\nUser: What does Assistant: mean here?\n\nAssistant:", 0),
        (" It names the speaker.</s>", 1),
        ("\n\nUser: Thanks\n\nAssistant:", 0),
        (" You are welcome.</s>", 1),
        ("\n\n", 0)])


def test_batch_masks_match_single_samples(chatml):
    records = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * (i + 1)}]}
               for i in range(5)]
    rendered = [chatml.render(parse_conversation(r, "messages", 1)) for r in records]
    batch = chatml.encode([t for t, _ in rendered], [s for _, s in rendered])
    for k, (text, spans) in enumerate(rendered):
        single = chatml.encode([text], [spans])
        lo, hi = batch.offsets[k], batch.offsets[k + 1]
        assert batch.input_ids[lo:hi].tolist() == single.input_ids.tolist()
        assert batch.loss_mask[lo:hi].tolist() == single.loss_mask.tolist()


def test_template_without_generation_prompt_is_refused(make_tokenizer_dir):
    no_prompt = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    tok_dir = make_tokenizer_dir("noprompt", no_prompt)
    with pytest.raises(InputError, match="no generation prompt"):
        ChatMasker(AutoTokenizer.from_pretrained(tok_dir))


def test_turn_without_the_usual_end_is_refused_not_mismasked(make_tokenizer_dir):
    # Like Llama-3.1: a tool-call turn ends with <|eom_id|>, not <|eot_id|>.
    eom = templates.LLAMA3.replace("{%- endfor %}{{- '<|eot_id|>' }}", "{%- endfor %}{{- '<|eom_id|>' }}")
    tok_dir = make_tokenizer_dir("llama3eom", eom, special=[*templates.LLAMA3_SPECIAL, "<|eom_id|>"],
                                 bos_token="<|begin_of_text|>")
    masker = ChatMasker(AutoTokenizer.from_pretrained(tok_dir))
    assert masker.info.turn_start == "<|start_header_id|>"
    record = tool_conversation()
    del record["tools"]
    with pytest.raises(TemplateError, match="no '<\\|eot_id\\|>' before the next"):
        masker.render(parse_conversation(record, "messages", 1))


def test_named_templates_render_as_the_engines_pick_them(chatml_dir, tmp_path):
    """A folder with additional_chat_templates/ loads as a dict of templates (it crashed the masker). Like
    transformers' apply_chat_template and vLLM, a conversation with tools renders through "tool_use", the rest
    through "default"; the fingerprint covers both."""
    import shutil

    tok_dir = tmp_path / "tok"
    shutil.copytree(chatml_dir, tok_dir)
    default = (tok_dir / "chat_template.jinja").read_text()
    (tok_dir / "additional_chat_templates").mkdir()
    (tok_dir / "additional_chat_templates" / "tool_use.jinja").write_text("{{- 'TOOL MODE\\n' }}" + default)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert isinstance(tok.chat_template, dict) and set(tok.chat_template) == {"default", "tool_use"}
    masker = ChatMasker(tok)
    plain = tool_conversation()
    del plain["tools"]
    text, _ = masker.render(parse_conversation(plain, "messages", 1))
    assert not text.startswith("TOOL MODE")
    with_tools = parse_conversation(tool_conversation(), "messages", 1)
    text, spans = masker.render(with_tools)
    assert text.startswith("TOOL MODE\n<|im_start|>system")
    assert [text[a:b] for a, b in spans][-1] == "<think>\nReport it.\n</think>\n\nSunny, 21 C.<|im_end|>"
    assert masker.template_sha != ChatMasker(AutoTokenizer.from_pretrained(chatml_dir)).template_sha
    (tok_dir / "chat_template.jinja").unlink()
    with pytest.raises(InputError, match="none is 'default'"):
        ChatMasker(AutoTokenizer.from_pretrained(tok_dir))
