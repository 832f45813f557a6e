"""Test data for extraction tests: small merged datasets written directly with pyarrow, CLI runs."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_samples(n: int, seed: int, min_len: int = 4, max_len: int = 48, vocab: int = 49152) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] * (length // 3) + [1] * (length - length // 3)
        digest = hashlib.sha256(repr((ids, mask)).encode()).hexdigest()[:32]
        out.append({"id": digest, "input_ids": ids, "loss_mask": mask})
    return out


def write_merged(folder, samples: list[dict]) -> str:
    """A MERGED folder holding train.parquet with the contract's columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "id": pa.array([s["id"] for s in samples], pa.string()),
        "input_ids": pa.array([s["input_ids"] for s in samples], pa.list_(pa.int32())),
        "loss_mask": pa.array([s["loss_mask"] for s in samples], pa.list_(pa.uint8())),
        "num_tokens": pa.array([len(s["input_ids"]) for s in samples], pa.int32()),
        "num_loss_tokens": pa.array([sum(s["loss_mask"]) for s in samples], pa.int32()),
        "source": pa.array(["test"] * len(samples), pa.string()),
    })
    pq.write_table(table, folder / "train.parquet")
    return str(folder)


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # same thread count in every run: same float results
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_cli(args: list[str], timeout: float = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3.cli", "extract", *args], cwd=REPO, env=cli_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def tree_bytes(root) -> dict[str, bytes]:
    """Every file under root (relative name -> content), temp files, adapt files and measured rates
    (eagle3/rates.py: timings, not store content) left out."""
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".tmp") and not p.name.startswith("adapt-")
            and p.relative_to(root).parts[0] != "rates"}


