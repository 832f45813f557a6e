"""Train the EAGLE-3 draft on a hidden-state store (training-time test, TTT).

Resumes from OUT/latest.json when it exists. Exit codes: 0 done, 2 bad input
(never retry), 75 out of memory (state saved with half the micro-batch and
twice the accumulation; re-run the same command to resume).

Data-parallel: `eagle3 train --nproc N ...` launches torchrun itself and keeps the exit codes above (torchrun
alone exits 1 whatever its workers' codes); `python -m torch.distributed.run --nproc_per_node N -m
eagle3.train.cli ...` works too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path



def add_arguments(p: argparse.ArgumentParser) -> None:
    from eagle3.train.config import TrainConfig

    d = TrainConfig(store="", vocab="", out="")
    p.add_argument("--store", required=True, help="hidden-state store (folder or s3://)")
    p.add_argument("--vocab", required=True, help="vocab folder with vocab.safetensors (d2t, t2d)")
    p.add_argument("--out", required=True, help="checkpoint folder CKPT (resumed when it holds latest.json)")
    p.add_argument("--merged", default=None,
                   help="merged dataset folder: train only on its samples (the store may hold other runs' too)")
    p.add_argument("--target", default=None, help="target model dir/alias (default: store.json model_name)")
    p.add_argument("--max-steps", type=int, default=d.max_steps, help="stop after N optimizer steps (0: all epochs)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--ttt-length", type=int, default=d.ttt_length, help="training-time-test steps")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (cosine, warm-up)")
    p.add_argument("--token-budget", type=int, default=d.token_budget,
                   help="micro-batch size in padded tokens per process")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum,
                   help="a step holds token-budget x grad-accum x processes tokens")
    p.add_argument("--init", choices=("target", "random"), default=d.init, help="fresh draft initialisation")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out evaluation every N steps")
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint every N steps")
    p.add_argument("--heldout-share", type=float, default=d.heldout_share)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes on this machine (runs torchrun; one GPU each on CUDA)")


def config_from_args(args: argparse.Namespace):
    from eagle3.train.config import TrainConfig

    keys = ("store", "vocab", "out", "merged", "target", "max_steps", "epochs", "ttt_length", "lr", "token_budget",
            "grad_accum", "init", "eval_every", "log_every", "save_every", "heldout_share", "seed", "device")
    return TrainConfig(**{k: getattr(args, k) for k in keys})


STATUS_ENV = "EAGLE3_TRAIN_STATUS_DIR"  # where torchrun workers leave their error's exit code


def run(args: argparse.Namespace) -> int:
    from eagle3.errors import Eagle3Error
    from eagle3.train.loop import train

    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return launch(args)
    cfg = config_from_args(args)
    try:
        summary = train(cfg)
    except Eagle3Error as e:
        if os.environ.get(STATUS_ENV):
            code = getattr(e, "EXIT_CODE", 2)
            Path(os.environ[STATUS_ENV], f"rank-{os.environ.get('RANK', '0')}.json").write_text(
                json.dumps({"exit_code": code, "error": str(e)}))
        raise
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(summary, indent=1))
    return 0


def launch(args: argparse.Namespace) -> int:
    """Run this command under torchrun with ``args.nproc`` workers; return 2/75 when a worker failed so."""
    import subprocess
    import tempfile

    argv = []
    for action_key, value in sorted(vars(args).items()):
        if action_key.startswith("_") or action_key in ("nproc", "command", "verbose") or value is None:
            continue
        argv += [f"--{action_key.replace('_', '-')}", str(value)]
    with tempfile.TemporaryDirectory(prefix="eagle3-train-status-") as status:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "-m", "eagle3.train.cli", *argv]
        code = subprocess.run(cmd, env=dict(os.environ, **{STATUS_ENV: status})).returncode
        codes = [json.loads(p.read_text())["exit_code"] for p in Path(status).glob("rank-*.json")]
    if code == 0:
        return 0
    for wanted in (2, 75):  # bad input wins: retrying cannot fix it
        if wanted in codes:
            return wanted
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m eagle3.train.cli` (what torchrun launches): same exit codes as `eagle3 train`."""
    import logging

    from eagle3.errors import Eagle3Error

    parser = argparse.ArgumentParser(prog="eagle3 train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except Eagle3Error as e:
        print(f"eagle3 train: error: {e}", file=sys.stderr)
        return getattr(e, "EXIT_CODE", 2)


if __name__ == "__main__":
    sys.exit(main())
