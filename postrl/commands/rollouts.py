"""`postrl rollouts RUN_DIR --sql "..." | --view NAME [--format table|csv|json]`: query stored rollouts."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from collections.abc import Callable
from typing import Any

from postrl.errors import UserError
from postrl.store.query import VIEWS, QueryResult, query, query_view


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    views = "; ".join(f"{name}: {v.description}" for name, v in VIEWS.items())
    p = subparsers.add_parser(
        "rollouts",
        help="query a run's stored rollouts with SQL (DuckDB)",
        description="Query RUN_DIR/rollouts/*.parquet with DuckDB; the shards are the view `rollouts`. "
        f"Named views: {views}.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding rollouts/")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--sql", help="SQL to run, e.g. \"SELECT domain, avg(reward) FROM rollouts GROUP BY domain\"")
    what.add_argument("--view", choices=sorted(VIEWS), help="run a named view")
    p.add_argument("--format", choices=sorted(FORMATTERS), default="table", help="output format")
    p.add_argument("--max-width", type=int, default=60, help="table format: cut cells longer than this")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.view:
        result = query_view(args.run_dir, args.view)
    elif args.sql:
        result = query(args.run_dir, args.sql)
    else:
        raise UserError("give --sql \"SELECT ...\" or --view NAME (views: " + ", ".join(sorted(VIEWS)) + ")")
    print(FORMATTERS[args.format](result, args.max_width), end="")
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_table(result: QueryResult, max_width: int = 60) -> str:
    def clip(text: str) -> str:
        text = text.replace("\n", "\\n")
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[clip(_cell(v)) for v in row] for row in result.rows]
    header = [clip(c) for c in result.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.append(f"({len(cells)} row{'s' if len(cells) != 1 else ''})")
    return "\n".join(lines) + "\n"


def format_csv(result: QueryResult, max_width: int = 0) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(result.columns)
    w.writerows([[_cell(v) if not isinstance(v, float) else repr(v) for v in r] for r in result.rows])
    return buf.getvalue()


def _jsonable(value: Any) -> Any:
    # NaN/inf are not JSON; null keeps the output loadable by any JSON reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # Decimal, dates, UUIDs


def format_json(result: QueryResult, max_width: int = 0) -> str:
    records = [dict(zip(result.columns, (_jsonable(v) for v in row))) for row in result.rows]
    return json.dumps(records, ensure_ascii=False) + "\n"


FORMATTERS: dict[str, Callable[[QueryResult, int], str]] = {
    "table": format_table,
    "csv": format_csv,
    "json": format_json,
}
