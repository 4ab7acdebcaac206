"""`postrl report RUN_DIR [RUN_DIR ...] [--out PATH]`: one run's report.html, or several runs compared.

    postrl report runs/a                          # -> runs/a/report.html
    postrl report runs/a runs/b --out cmp.html    # curves overlaid, eval tables, config difference
"""

from __future__ import annotations

import argparse

from postrl.monitor.compare import COMPARE_FILE, write_comparison
from postrl.monitor.report import REPORT_FILE, write_report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write RUN_DIR/report.html, or compare several runs side by side",
        description="One run directory: render its metrics.jsonl, alerts.jsonl and eval/*.json into one HTML "
        "file with the plots embedded. Several: one page with their curves overlaid, their eval tables "
        "and the difference of their configs. Both pages are self-contained and work offline.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory (two or more: a comparison)")
    p.add_argument("--out", help=f"output file (default RUN_DIR/{REPORT_FILE}; for a comparison ./{COMPARE_FILE})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if len(args.run_dirs) == 1:
        print(write_report(args.run_dirs[0], args.out))
    else:
        print(write_comparison(args.run_dirs, args.out or COMPARE_FILE))
    return 0
