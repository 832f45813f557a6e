"""How `eagle3 train` runs: in this process, or data-parallel under torchrun that it launches itself.

`eagle3 train --nproc N ...` runs torchrun with N workers, each `python -m eagle3 train --config CFG.json`,
and keeps the exit codes of `eagle3` (2 bad input, 75 out of memory): torchrun alone exits 1 whatever its
workers' codes, so each worker leaves its error's exit code in a status folder. The TrainConfig flags
themselves come from the stage registry (eagle3.stages).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from eagle3.config import config_from_args, to_dict
from eagle3.errors import Eagle3Error, GpuOutOfMemory, InputError, exit_code
from eagle3.train import TrainConfig, train

STATUS_ENV = "EAGLE3_TRAIN_STATUS_DIR"  # where torchrun workers leave their error's exit code


def add_arguments(p: argparse.ArgumentParser) -> None:
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
               "-m", "eagle3", "train", "--config", str(config)]
        code = subprocess.run(cmd, env=dict(os.environ, **{STATUS_ENV: str(status)})).returncode
        codes = [json.loads(p.read_text())["exit_code"] for p in status.glob("rank-*.json")]
    if code == 0:
        return 0
    for wanted in (InputError.EXIT_CODE, GpuOutOfMemory.EXIT_CODE):  # bad input wins: retrying cannot fix it
        if wanted in codes:
            return wanted
    return code
