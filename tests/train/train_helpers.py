"""Helpers for the training tests: a tiny hidden-state store and vocab map, a peaked target, CLI runs."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import torch

from tests.train.vocab_files import write_vocab

REPO = Path(__file__).resolve().parents[2]
DRAFT_VOCAB = 64


def _sequences(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    seqs = []
    for _ in range(n):
        period = rng.randint(2, 5)
        pattern = [1000 + rng.randrange(40) for _ in range(period)]
        length = rng.randint(10, 40)
        seqs.append([pattern[i % period] for i in range(length)])
    return seqs


def build_store(root: Path, target_dir: str, n: int = 48, storage_option: str = "bf16",
                seqs: list[list[int]] | None = None, draft_vocab: int = DRAFT_VOCAB,
                prompt_share: float = 0.0, device: str = "cpu") -> tuple[str, str]:
    """A store of ``n`` samples and its vocab; each sample's first max(3, prompt_share x length) tokens carry
    no loss (a prompt). ``device``: where the target computes the states."""

    from eagle3.extract.capture import TargetCapture
    from eagle3.extract.codec import encode
    from eagle3.extract.store import StoreWriter
    from eagle3.target import model_fingerprint

    cap = TargetCapture(target_dir, device)
    seqs = seqs or _sequences(n)
    aux, last, lengths = cap.forward(seqs)
    aux, last = aux.cpu(), last.cpu()
    writer = StoreWriter(str(root / "store"), model_fp=model_fingerprint(target_dir), model_name=target_dir,
                         aux_layers=cap.aux_layers, hidden_size=cap.hidden_size, vocab_size=cap.vocab_size,
                         storage_option=storage_option, task="0of1").open()
    samples, argmax, start = [], [], 0
    for i, (seq, n_tok) in enumerate(zip(seqs, lengths)):
        a, l_ = aux[start:start + n_tok], last[start:start + n_tok]
        start += n_tok
        argmax += cap.lm_head(l_).argmax(-1).tolist()
        prompt = min(n_tok, max(3, round(prompt_share * n_tok)))
        mask = torch.tensor([0] * prompt + [1] * (n_tok - prompt), dtype=torch.uint8)
        samples.append({"id": f"sample{i:03d}", "input_ids": torch.tensor(seq, dtype=torch.int32),
                        "loss_mask": mask, "tensors": encode(storage_option, a, l_, lm_head=cap.lm_head)})
    half = len(samples) // 2
    for chunk in (samples[:half], samples[half:]):  # two shards
        writer.write_shard(chunk)
    # draft vocab: the target's most frequent argmax tokens, then the input tokens
    counts: dict[int, int] = {}
    for t in argmax:
        counts[t] = counts.get(t, 0) + 1
    chosen = [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1])][:draft_vocab]
    chosen += [t for t in range(1000, 1000 + 2 * draft_vocab) if t not in chosen][: draft_vocab - len(chosen)]
    vocab = write_vocab(root / "vocab", chosen, cap.vocab_size)
    return str(root / "store"), vocab


def peaked_copy(src: str, dst: Path, scale: float = 20.0) -> str:
    """The tiny random Llama with lm_head x scale: a random init predicts nearly
    uniformly, which leaves a draft nothing to learn; a peaked target does."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * scale
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def run_cli(args: list[str], env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m eagle3.cli train ...` as a real subprocess."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "train", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
