"""The one stage registry (eagle3.stages) wires the DAG's stages and every `eagle3` subcommand."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.cli import build_parser
from eagle3.stages import COMMANDS, STAGES

REPO = Path(__file__).resolve().parents[2]

# DESIGN.md's CLI contract: these commands and flags must keep working.
CONTRACT = {
    "tokenize": "--manifest M.yaml --tokenizer T --out PREP --dataset a --max-reject-share 0.1",
    "stats": "--prepared PREP",
    "merge": "--prepared PREP --out MERGED --max-seq-len 64 --seed 1 --drop a,b --export-jsonl",
    "verify": "--merged MERGED",
    "vocab": "--merged MERGED --draft-vocab-size 32 --out VOCAB",
    "regenerate": "--manifest M.yaml --backend openai --model T --out DIR --max-tokens 8 --concurrency 2",
    "extract": "--merged MERGED --model T --out STORE --shard 0/2",
    "train": "--store STORE --vocab VOCAB --out CKPT --max-steps 3 --ttt-length 7 --nproc 1",
    "export": "--checkpoint CKPT --out DRAFT",
    "evaluate": "--target T --draft DRAFT --prompts humaneval --steps 3 --limit 2 --out DIR",
}


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    return out.getvalue()


def test_the_cli_contract_parses():
    for command, flags in CONTRACT.items():
        args = build_parser().parse_args([command, *flags.split()])
        assert args.command == command


def test_every_command_has_help_and_the_dag_stages_are_the_registry_s():
    assert set(CONTRACT) <= set(COMMANDS)
    assert list(COMMANDS)[0] == "demo-data" and "demo-data" not in STAGES  # a CLI-only command
    assert set(STAGES) == {n for n, s in COMMANDS.items() if s.dag}
    main = " ".join(_help(["--help"]).split())  # argparse wraps the lines
    for name, command in COMMANDS.items():
        assert f"{name} {command.help}" in main
        text = _help([name, "--help"])
        assert command.description().splitlines()[0] in text and "--config FILE.json" in text, name


def test_aliases_and_choices_come_from_the_registry():
    assert build_parser().parse_args(["tokenize", "--tokenizer", "T"]).model == "T"
    assert build_parser().parse_args(["regenerate", "--dataset", "a,b"]).datasets == ("a", "b")
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(["extract", "--storage-option", "fp4"])
    assert "{bf16,fp8,fp8-topk}" in _help(["extract", "--help"])


def test_no_stage_has_a_cli_shim_left():
    assert sorted((REPO / "eagle3").glob("*/cli.py")) == []


def test_python_dash_m_eagle3_is_the_eagle3_command():
    """What torchrun's workers run (`-m eagle3 train`): the same parser and exit codes."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "eagle3", "train", "--help"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "--nproc" in out.stdout and "--ttt-length" in out.stdout
    out = subprocess.run([sys.executable, "-m", "eagle3", "merge", "--prepared", "/nonexistent", "--out", "/tmp/x"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "run `eagle3 tokenize` first" in out.stderr
