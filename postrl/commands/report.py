"""`postrl report RUN_DIR [--out PATH]`: write the run's self-contained report.html and print its path."""

from __future__ import annotations

import argparse

from postrl.monitor.report import REPORT_FILE, write_report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write RUN_DIR/report.html: plots, alerts and eval results of a run",
        description="Render metrics.jsonl, alerts.jsonl and eval/*.json of RUN_DIR into one HTML file "
        "with the plots embedded.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory")
    p.add_argument("--out", help=f"output file (default RUN_DIR/{REPORT_FILE})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(write_report(args.run_dir, args.out))
    return 0
