"""Train the EAGLE-3 draft on a hidden-state store (training-time test, TTT).

Resumes from OUT/latest.json when it exists. Exit codes: 0 done, 2 bad input
(never retry), 75 out of memory (state saved with half the micro-batch and
twice the accumulation; re-run the same command to resume).

Online: `eagle3 train --online --merged MERGED --model T --store STORE ...` runs the target inside
training (samples the store lacks are computed per micro-batch; --write-back stores them).

Data-parallel: `eagle3 train --nproc N ...` launches torchrun itself and keeps the exit codes above (torchrun
alone exits 1 whatever its workers' codes); `python -m torch.distributed.run --nproc_per_node N -m
eagle3.train.cli --config CFG.json` works too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from eagle3.config import add_config_arguments, config_from_args, to_dict
from eagle3.devices import PRECISIONS
from eagle3.errors import Eagle3Error, exit_code
from eagle3.train import TrainConfig, train

STATUS_ENV = "EAGLE3_TRAIN_STATUS_DIR"  # where torchrun workers leave their error's exit code


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, TrainConfig, aliases={"model": ["--target"]},
                         choices={"init": ("target", "random"), "precision": PRECISIONS})
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes on this machine (runs torchrun; one GPU each on CUDA)")


def run(args: argparse.Namespace) -> dict | int:
    cfg = config_from_args(TrainConfig, args)
    if getattr(args, "nproc", 1) > 1 and "WORLD_SIZE" not in os.environ:
        return launch(cfg, args.nproc)
    try:
        summary = train(cfg)
    except Eagle3Error as e:
        if os.environ.get(STATUS_ENV):
            Path(os.environ[STATUS_ENV], f"rank-{os.environ.get('RANK', '0')}.json").write_text(
                json.dumps({"exit_code": exit_code(e), "error": str(e)}))
        raise
    return summary if int(os.environ.get("RANK", "0")) == 0 else 0


def launch(cfg: TrainConfig, nproc: int) -> int:
    """Run training under torchrun with ``nproc`` workers (each reads the same config JSON); return 2/75 when
    a worker failed so."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="eagle3-train-") as tmp:
        config = Path(tmp, "train_config.json")
        config.write_text(json.dumps(to_dict(cfg)))
        status = Path(tmp, "status")
        status.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "eagle3.train.cli", "--config", str(config)]
        code = subprocess.run(cmd, env=dict(os.environ, **{STATUS_ENV: str(status)})).returncode
        codes = [json.loads(p.read_text())["exit_code"] for p in status.glob("rank-*.json")]
    if code == 0:
        return 0
    for wanted in (2, 75):  # bad input wins: retrying cannot fix it
        if wanted in codes:
            return wanted
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m eagle3.train.cli` (what torchrun launches): same exit codes as `eagle3 train`."""
    from eagle3.cli import main as eagle3_main

    return eagle3_main(["train", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
