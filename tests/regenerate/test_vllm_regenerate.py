"""Regeneration served by a REAL vLLM (CPU build, its own venv) that the stage starts and stops itself
(RegenerateConfig.server="vllm"): multi-turn replay through the openai path, the server's own usage
accounting, and greedy answers equal to the in-process hf backend's (an independent implementation)."""

from __future__ import annotations

import socket

import pytest
from regen_helpers import conversations, free_port, read_jsonl, write_dataset

from eagle3.regenerate import RegenerateConfig, regenerate

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_vllm_serves_the_run_and_is_gone_after_it(tmp_path, smollm2_dir):
    manifest = write_dataset(tmp_path, conversations(2, turns=2))
    port = free_port()
    common = dict(manifest=str(manifest), model=smollm2_dir, max_tokens=16, precision="float32")
    stats = regenerate(RegenerateConfig(out=str(tmp_path / "vllm"), backend="openai", server="vllm",
                                        server_port=port, concurrency=2, **common))["datasets"]["chat"]
    assert not _listening(port), "the vLLM server outlived the stage"
    assert stats["done"] == 2 and stats["failed"] == 0 and stats["requests"] == 4
    assert stats["completion_tokens"] > 0 and stats["prompt_tokens"] > stats["completion_tokens"]
    served = read_jsonl(tmp_path / "vllm/chat/regenerated.jsonl")
    assert all(m["content"].strip() for r in served for m in r["messages"] if m["role"] == "assistant")
    # The same greedy answers from transformers in this process (fp32 both): the first turn of each
    # conversation has the same prompt for both engines.
    regenerate(RegenerateConfig(out=str(tmp_path / "hf"), backend="hf", concurrency=2, **common))
    local = read_jsonl(tmp_path / "hf/chat/regenerated.jsonl")

    def first_answer(rec):
        return next(m["content"] for m in rec["messages"] if m["role"] == "assistant")

    assert [first_answer(r) for r in served] == [first_answer(r) for r in local]
