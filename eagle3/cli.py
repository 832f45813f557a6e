"""`eagle3` command line: one subcommand per pipeline stage.

The subcommands are the stage registry's commands (eagle3.stages): each one's flags are its
Config's fields, and ``run`` returns the stage's JSON summary (printed, and written to
``--result FILE``). Every stage also takes ``--config FILE.json``: its whole config as JSON
(flags given too override it), which is how the Airflow operators start subprocess stages, so
the config dataclass is the one schema. Exit codes: eagle3.errors (2 bad input, 3 failed
gate, 75 out of memory). Stage modules keep torch and friends inside functions, so
`--help` is fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from eagle3.errors import Eagle3Error, exit_code
from eagle3.stages import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        p = sub.add_parser(command.name, help=command.help, description=command.description(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=None, metavar="FILE.json",
                       help="the stage's whole config as JSON (local or s3://); flags given too override it")
        p.add_argument("--result", default=None, metavar="FILE.json",
                       help="also write the stage's JSON summary here (how supervised stages report back)")
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def _exit_on_sigterm(signum, frame) -> None:
    # Airflow's on_kill and `kill` send SIGTERM: leave through `finally` blocks, which stop the servers a
    # stage started and remove its temporary files. A second SIGTERM (the task process dying: eagle3/lifetime.py)
    # must not cut that cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
