"""`eagle3` command line: one subcommand per pipeline stage.

Each stage's CLI module provides ``add_arguments(parser)`` and ``run(args)``, which
returns the stage's JSON summary (printed, and written to ``--result FILE``). Every
stage also takes ``--config FILE.json``: its whole config as JSON (flags given too
override it), which is how the Airflow operators start subprocess stages, so the
config dataclass is the one schema. Exit codes: eagle3.errors (2 bad input, 3 failed
gate, 75 out of memory). Stage modules keep torch and friends inside functions, so
`--help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading

from eagle3.errors import Eagle3Error, exit_code

# subcommand -> (CLI module, one-line help). Order follows the DAG.
STAGES = {
    "demo-data": ("eagle3.demo.corpus", "write the bundled demo corpus and its manifest"),
    "discover": ("eagle3.discover", "list a manifest's datasets: what to regenerate, tokenize and extract"),
    "regenerate": ("eagle3.regenerate.cli", "replace assistant turns with the target's own answers"),
    "tokenize": ("eagle3.tokenize.cli", "tokenize datasets of a manifest with the chat template and loss masks"),
    "stats": ("eagle3.stats", "per-dataset token/sample statistics of a prepared folder"),
    "merge": ("eagle3.merge.cli", "drop, truncate, dedupe and shuffle prepared datasets into train.parquet"),
    "verify": ("eagle3.verify.cli", "re-check a merged dataset and write verify.json (the gate)"),
    "vocab": ("eagle3.vocab.cli", "build the draft vocab map d2t/t2d from loss-token frequencies"),
    "extract": ("eagle3.extract.cli", "run the target and store aux/last hidden states in packed shards"),
    "train": ("eagle3.train.cli", "train the EAGLE-3 draft with training-time test"),
    "export": ("eagle3.export", "write the EAGLE3 draft directory SGLang and vLLM load"),
    "evaluate": ("eagle3.evaluate.cli", "speculative decoding benchmark: acceptance length, speed, lossless check"),
    "publish": ("eagle3.publish", "register an evaluated draft and publish it if it beats the best"),
    "report": ("eagle3.report.cli", "write a DAG run's report (report.json, plots, report.html, run_summary.json)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in STAGES.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=None, metavar="FILE.json",
                       help="the stage's whole config as JSON (local or s3://); flags given too override it")
        p.add_argument("--result", default=None, metavar="FILE.json",
                       help="also write the stage's JSON summary here (how supervised stages report back)")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _exit_on_sigterm(signum, frame) -> None:
    # Airflow's on_kill and `kill` send SIGTERM: leave through `finally` blocks, which stop the servers a
    # stage started and remove its temporary files.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        summary = args._run(args)
    except Eagle3Error as e:
        print(f"eagle3 {args.command}: error: {e}", file=sys.stderr)
        return exit_code(e)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    if isinstance(summary, int):
        return summary
    if summary is not None:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
        if args.result:
            from eagle3 import storage

            storage.write_json(args.result, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
