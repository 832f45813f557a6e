"""`eagle3` command line: one subcommand per pipeline stage.

Each stage module provides ``add_arguments(parser)`` and ``run(args) -> int``.
Stage modules keep torch and friends inside functions, so `--help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from eagle3.errors import Eagle3Error

# subcommand -> (module, one-line help). Order follows the DAG.
STAGES = {
    "demo-data": ("eagle3.demo_corpus", "write the bundled demo corpus and its manifest"),
    "regenerate": ("eagle3.regenerate.cli", "replace assistant turns with the target's own answers"),
    "tokenize": ("eagle3.tokenize.cli", "tokenize datasets of a manifest with the chat template and loss masks"),
    "stats": ("eagle3.stats", "per-dataset token/sample statistics of a prepared folder"),
    "merge": ("eagle3.merge", "drop, truncate, dedupe and shuffle prepared datasets into train.parquet"),
    "verify": ("eagle3.verify", "re-check a merged dataset and write verify.json (the gate)"),
    "vocab": ("eagle3.vocab", "build the draft vocab map d2t/t2d from loss-token frequencies"),
    "extract": ("eagle3.extract.cli", "run the target and store aux/last hidden states in packed shards"),
    "train": ("eagle3.train.cli", "train the EAGLE-3 draft with training-time test"),
    "export": ("eagle3.export", "write the SGLang-loadable EAGLE3 draft directory"),
    "evaluate": ("eagle3.evaluate.cli", "speculative decoding benchmark: acceptance length, speed, lossless check"),
    "publish": ("eagle3.evaluate.publish", "register an evaluated draft and publish it if it beats the best"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in STAGES.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("eagle3"):
                continue  # stage not built yet in this checkout
            raise
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._run(args) or 0)
    except Eagle3Error as e:
        print(f"eagle3 {args.command}: error: {e}", file=sys.stderr)
        return getattr(e, "EXIT_CODE", 2)


if __name__ == "__main__":
    sys.exit(main())
