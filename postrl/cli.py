"""The `postrl` command. Each subcommand lives in `postrl/commands/<name>.py` and defines
`add_parser(subparsers)`, which registers its arguments and sets `func(args) -> int`.

Errors a user can fix (`UserError`: bad config key, missing file, unknown domain, ...) are
printed as one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from postrl.errors import UserError

COMMANDS = ["train", "eval", "pretrain", "plan", "rollouts", "report", "verify", "reward_check", "rm", "sandbox"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"postrl.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
