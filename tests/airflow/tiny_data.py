"""A tiny two-dataset manifest for whole-DAG tests (seconds, not minutes)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml


def _conversation(rng: random.Random, i: int) -> dict:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return {"messages": [
        {"role": "user", "content": f"Question {i}: what is {a} plus {b}?"},
        {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
    ]}


def write_dataset(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    path.write_text("".join(json.dumps(_conversation(rng, seed * 1000 + i)) + "\n" for i in range(n)))


def write_tiny_manifest(root: Path, n_per_dataset: int = 30) -> Path:
    """Writes alpha.jsonl, beta.jsonl and manifest.yaml under root; returns the manifest path."""
    root.mkdir(parents=True, exist_ok=True)
    write_dataset(root / "alpha.jsonl", n_per_dataset, seed=1)
    write_dataset(root / "beta.jsonl", n_per_dataset, seed=2)
    manifest = {"datasets": [
        {"name": "alpha", "source": "alpha.jsonl", "format": "messages", "category": "math"},
        {"name": "beta", "source": "beta.jsonl", "format": "messages", "category": "math"},
    ]}
    (root / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return root / "manifest.yaml"


def tiny_conf(manifest: Path, model: str, storage_root: str, **overrides) -> dict:
    """DAG-run conf that makes every stage take seconds on the tiny random model. The Params' defaults are the
    demo's settings (eagle3.demo.settings): its drop list and its vLLM comparison are cleared here."""
    conf = {
        "model": model, "manifest": str(manifest), "storage_root": storage_root, "drop": [],
        "evaluate_compare_with": [],
        "max_seq_len": 256, "draft_vocab_size": 512, "ttt_length": 2, "max_steps": 4, "epochs": 1,
        "extract_token_budget": 512, "train_token_budget": 512, "extract_shards": 2, "benchmark_prompts": "humaneval", "benchmark_limit": 2,
        "max_new_tokens": 12, "steps": 2,
    }
    budget = overrides.pop("token_budget", None)
    if budget is not None:
        conf.update(extract_token_budget=budget, train_token_budget=budget)
    conf.update(overrides)
    return conf
