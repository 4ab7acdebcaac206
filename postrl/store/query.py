"""SQL over a run's rollouts with DuckDB.

    query("runs/demo", "SELECT domain, avg(reward) FROM rollouts GROUP BY domain")
    query("runs/demo", "SELECT * FROM pass_rate_by_step")

The shards are exposed as a view named `rollouts` (one row per completion, columns as in
`postrl.store.rollouts.SCHEMA`), next to the named views in `VIEWS`, which any query may use.
DuckDB reads only complete `step_*.parquet` shards, so querying a live run is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from postrl.errors import UserError
from postrl.store.rollouts import SHARD_DIR, SHARD_GLOB, shard_steps


@dataclass(frozen=True)
class View:
    description: str
    sql: str


# Registry of named views; each is created in every query session and may build on `rollouts`.
# `correct` is NULL when the verifier could not decide. `pass_rate` counts those as not passed,
# exactly as the loop's `pass_rate` metric does, so the numbers match the report; `verified_pass_rate`
# leaves them out and `unverified` counts them, so a broken verifier never looks like a hard task.
_PASS = "avg(CAST(coalesce(correct, false) AS DOUBLE))"
_VERIFIED_PASS = "avg(CAST(correct AS DOUBLE))"
VIEWS: dict[str, View] = {
    "pass_rate_by_step": View(
        "pass rate, mean reward and unverified count per step and domain",
        f"""SELECT step, domain, count(*) AS samples, {_PASS} AS pass_rate,
                   {_VERIFIED_PASS} AS verified_pass_rate, avg(reward) AS mean_reward,
                   count(*) FILTER (WHERE correct IS NULL) AS unverified
            FROM rollouts GROUP BY step, domain ORDER BY step, domain""",
    ),
    "pass_rate_by_domain": View(
        "pass rate, mean reward and mean completion length per domain over the whole run",
        f"""SELECT domain, count(*) AS samples, {_PASS} AS pass_rate,
                   {_VERIFIED_PASS} AS verified_pass_rate, avg(reward) AS mean_reward,
                   avg(len(token_ids)) AS mean_tokens
            FROM rollouts GROUP BY domain ORDER BY domain""",
    ),
    "top_failures": View(
        "tasks attempted most and solved least, with one failing completion each",
        f"""SELECT domain, task_id, count(*) AS attempts, {_PASS} AS pass_rate,
                   avg(reward) AS mean_reward,
                   any_value(completion) FILTER (WHERE NOT coalesce(correct, false)) AS failing_completion,
                   any_value(answer) AS answer
            FROM rollouts GROUP BY domain, task_id HAVING {_PASS} < 1
            ORDER BY pass_rate ASC, attempts DESC, domain, task_id LIMIT 50""",
    ),
    "verifier_errors": View(
        "samples whose verifier timed out or failed, with its message",
        """SELECT step, sample, domain, task_id, verifier_status, detail
           FROM rollouts WHERE verifier_status IS DISTINCT FROM 'ok' ORDER BY step, sample""",
    ),
    "length_by_step": View(
        "mean completion tokens and share cut off at max_new_tokens per step and domain",
        """SELECT step, domain, avg(len(token_ids)) AS mean_tokens,
                  avg(CAST(finish_reason = 'length' AS DOUBLE)) AS truncated_share
           FROM rollouts GROUP BY step, domain ORDER BY step, domain""",
    ),
    "reward_components_by_step": View(
        "mean of each named reward term per step",
        """SELECT step, component, avg(value) AS mean_value, count(*) AS samples
           FROM (SELECT step, unnest(map_keys(reward_components)) AS component,
                        unnest(map_values(reward_components)) AS value FROM rollouts)
           GROUP BY step, component ORDER BY step, component""",
    ),
    # multi-turn episodes (rows with `turns`): single-turn rows are left out
    "tools_by_step": View(
        "episodes per step and domain: tool-call rate, calls and tool-error rate, assistant turns",
        """SELECT step, domain, count(*) AS episodes,
                  avg(CAST(tool_calls > 0 AS DOUBLE)) AS tool_call_rate,
                  avg(tool_calls) AS calls_per_episode,
                  sum(tool_errors) / nullif(sum(tool_calls), 0) AS tool_error_rate,
                  avg(len(list_filter(turns, lambda t: t.role = 'assistant'))) AS turns_per_episode
           FROM rollouts WHERE turns IS NOT NULL GROUP BY step, domain ORDER BY step, domain""",
    ),
    "episode_ends": View(
        "where episodes end (done, max_turns, context, length) per domain, with their pass rate",
        f"""SELECT domain, end_reason, count(*) AS episodes,
                   count(*) / sum(count(*)) OVER (PARTITION BY domain) AS share,
                   {_PASS} AS pass_rate
            FROM rollouts WHERE turns IS NOT NULL GROUP BY domain, end_reason ORDER BY domain, episodes DESC""",
    ),
    "tool_calls": View(
        "every tool's calls by status (ok, error, timeout, output_limit, malformed, unknown_tool)",
        """SELECT t.tool AS tool, t.status AS status, count(*) AS calls, avg(t.seconds) AS mean_seconds
           FROM (SELECT unnest(turns) AS t FROM rollouts WHERE turns IS NOT NULL)
           WHERE t.role = 'tool' GROUP BY t.tool, t.status ORDER BY calls DESC""",
    ),
}


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def connect(run_dir: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB session with `rollouts` and the named views defined."""
    run_dir = Path(run_dir)
    if not shard_steps(run_dir):
        raise UserError(f"no rollouts in {run_dir} (expected {run_dir / SHARD_DIR / SHARD_GLOB})")
    glob = str(run_dir / SHARD_DIR / SHARD_GLOB).replace("'", "''")
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE VIEW rollouts AS SELECT * FROM read_parquet('{glob}', union_by_name=true)")
    columns = {row[0] for row in con.execute("DESCRIBE rollouts").fetchall()}
    for name, view in VIEWS.items():
        if "turns" not in columns and "turns" in view.sql:  # shards written before episodes were stored
            continue
        con.execute(f"CREATE VIEW {name} AS {view.sql}")
    return con


def query(run_dir: str | Path, sql: str) -> QueryResult:
    """Run `sql` over the run's rollouts. Bad SQL raises `UserError` with DuckDB's first line."""
    con = connect(run_dir)
    try:
        cur = con.execute(sql)
        if cur.description is None:  # a statement without a result set (e.g. CREATE VIEW)
            return QueryResult([], [])
        columns = [d[0] for d in cur.description]
        return QueryResult(columns, cur.fetchall())
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"query failed: {first}") from None
    finally:
        con.close()


def query_view(run_dir: str | Path, name: str) -> QueryResult:
    if name not in VIEWS:
        raise UserError(f"unknown view '{name}'; available: {', '.join(sorted(VIEWS))}")
    return query(run_dir, f"SELECT * FROM {name}")
