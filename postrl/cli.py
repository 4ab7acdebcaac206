"""The `postrl` command. Each subcommand lives in `postrl/commands/<name>.py` and defines
`add_parser(subparsers)`, which registers its arguments and sets `func(args) -> int`.

Errors a user can fix (`UserError`: bad config key, missing file, unknown domain, ...) are
printed as one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import postrl
from postrl.errors import UserError

COMMANDS = ["train", "eval", "pretrain", "plan", "rollouts", "report", "verify", "reward_check", "rm", "sandbox",
            "score", "export_rg"]

DESCRIPTION = """\
Reinforcement-learning post-training of language models on verifiable tasks.
postrl samples several attempts per problem, grades them with verifiers, a code sandbox
or a reward model, and reinforces what worked. A curriculum spends compute where problems
are within reach, monitors watch the run, runs resume exactly, and every rollout is kept in
a store you can query with SQL."""

EPILOG = """\
quickstart:
  postrl plan default                               the batch arithmetic of a recipe (built-in or a file)
  postrl train default                              train (the run directory is printed)
  postrl eval RUN_DIR/final --domains arith         evaluate the trained model
  postrl rollouts RUN_DIR --sql "SELECT domain, avg(reward) FROM rollouts GROUP BY domain"

`postrl COMMAND --help` describes each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="postrl", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"postrl {postrl.__version__}")
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
