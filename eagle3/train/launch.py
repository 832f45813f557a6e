"""How `eagle3 train` runs: in this process, or data-parallel under torchrun that it launches itself.

`eagle3 train --nproc N ...` runs torchrun with N workers, each `python -m eagle3 train --config CFG.json`,
and keeps the exit codes of `eagle3` (2 bad input, 75 out of memory): torchrun alone exits 1 whatever its
workers' codes, so each worker leaves its error's exit code in a status folder, and rank 0 its summary (what
`--result` and the Airflow task read). A SIGTERM (a killed task) is passed on to torchrun, which stops its
workers; torchrun starts them in sessions of their own, so each worker also asks Linux to SIGTERM it when its
parent dies (a torchrun killed outright). The TrainConfig flags themselves come from the stage registry
(eagle3.stages).
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
from eagle3.lifetime import die_with_parent
from eagle3.train import TrainConfig, train

STATUS_ENV = "EAGLE3_TRAIN_STATUS_DIR"  # where torchrun workers leave their error's exit code, rank 0 its summary
SUMMARY_FILE = "summary.json"
STOP_GRACE_S = 40.0  # torchrun gives its workers 30 s to stop after a SIGTERM


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes on this machine (runs torchrun; one GPU each on CUDA)")


def run(args: argparse.Namespace) -> dict | int:
    cfg = config_from_args(TrainConfig, args)
    if getattr(args, "nproc", 1) > 1 and "WORLD_SIZE" not in os.environ:
        return launch(cfg, args.nproc)
    status = os.environ.get(STATUS_ENV)
    if status:
        die_with_parent()
    try:
        summary = train(cfg)
    except Eagle3Error as e:
        if status:
            Path(status, f"rank-{os.environ.get('RANK', '0')}.json").write_text(
                json.dumps({"exit_code": exit_code(e), "error": str(e)}))
        raise
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if status:
        Path(status, SUMMARY_FILE).write_text(json.dumps(summary, default=str))
    return summary


def launch(cfg: TrainConfig, nproc: int) -> dict | int:
    """Run training under torchrun with ``nproc`` workers (each reads the same config JSON); return rank 0's
    summary, or 2/75 when a worker failed so."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="eagle3-train-") as tmp:
        config = Path(tmp, "train_config.json")
        config.write_text(json.dumps(to_dict(cfg)))
        status = Path(tmp, "status")
        status.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "eagle3", "train", "--config", str(config)]
        proc = subprocess.Popen(cmd, env=dict(os.environ, **{STATUS_ENV: str(status)}))
        try:
            code = proc.wait()
        except BaseException:  # SystemExit from SIGTERM (eagle3.cli): let torchrun stop its workers first
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        codes = [json.loads(p.read_text())["exit_code"] for p in status.glob("rank-*.json")]
        summary = status / SUMMARY_FILE
        result = json.loads(summary.read_text()) if code == 0 and summary.exists() else None
    if code == 0:
        if result is None:
            raise Eagle3Error(f"torchrun exited 0 but rank 0 left no {SUMMARY_FILE}")
        return result
    for wanted in (InputError.EXIT_CODE, GpuOutOfMemory.EXIT_CODE):  # bad input wins: retrying cannot fix it
        if wanted in codes:
            return wanted
    return code
