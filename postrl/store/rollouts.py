"""The rollout store: every sample of every step as one Parquet row.

    run_dir/rollouts/step_00000012.parquet     one shard per step, zstd-compressed

A shard is written to a hidden temp file in the same directory (`.step_XXXXXXXX.parquet.<pid>.tmp`),
fsynced, then `os.replace`d into place and the directory fsynced. Readers only ever glob
`step_*.parquet`, so a shard killed half-way is never visible: it is either absent or complete.
Writing a step again replaces its shard, which is what makes resume idempotent (a resumed run
rewrites the steps after its checkpoint; `truncate_after` drops any it will not reach again).

The row schema (`SCHEMA`, one row per completion) mirrors `RolloutRow` field for field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from postrl.faults import crash_point
from postrl.records import Score, Task

SCHEMA_VERSION = "1"
SHARD_DIR = "rollouts"
SHARD_GLOB = "step_*.parquet"
_SHARD_RE = re.compile(r"^step_(\d{8})\.parquet$")
_TMP_RE = re.compile(r"^\.step_\d{8}\.parquet\.\d+\.tmp$")

_TURN = pa.struct([("role", pa.string()), ("text", pa.string()), ("tokens", pa.int32()), ("tool", pa.string()),
                   ("status", pa.string()), ("seconds", pa.float64())])
"""One turn of a multi-turn episode (`postrl.records.Turn`)."""

SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("step", pa.int64()),
        ("policy_version", pa.int64()),
        ("domain", pa.string()),
        ("task_id", pa.string()),
        ("level", pa.int32()),
        ("group", pa.int32()),
        ("sample", pa.int32()),
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("behaviour_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("verifier_status", pa.string()),
        ("correct", pa.bool_()),
        ("detail", pa.string()),
        ("advantage", pa.float64()),
        ("finish_reason", pa.string()),
        ("temperature", pa.float64()),
        ("timings", pa.map_(pa.string(), pa.float64())),
        ("task_columns", pa.string()),
        ("extracted", pa.string()),
        ("loss_mask", pa.list_(pa.int8())),
        ("turns", pa.list_(_TURN)),
        ("end_reason", pa.string()),
        ("tool_calls", pa.int32()),
        ("tool_errors", pa.int32()),
        ("reward_logs", pa.string()),
    ],
    metadata={"postrl.schema_version": SCHEMA_VERSION},
)


@dataclass
class RolloutRow:
    """One stored completion. Field names are the Parquet column names."""

    run: str
    step: int
    policy_version: int
    """Optimiser updates the sampling policy had received (lags `step` when asynchronous)."""
    domain: str
    task_id: str
    level: int
    group: int
    """Prompt index within the step; advantages are relative within a group."""
    sample: int
    """Index of the completion within the step: (step, sample) is unique across the store."""
    prompt: str
    answer: str
    prompt_ids: list[int]
    completion: str
    token_ids: list[int]
    """Completion token ids, EOS included when emitted."""
    behaviour_logprobs: list[float]
    """Log-probs of `token_ids` under the sampling policy; replay's importance weights divide by these."""
    reward: float | None
    """None when the sample was never scored (not the same as a zero reward)."""
    reward_components: dict[str, float] = field(default_factory=dict)
    verifier_status: str | None = None
    correct: bool | None = None
    detail: str = ""
    advantage: float = 0.0
    finish_reason: str = "stop"
    temperature: float = 1.0
    timings: dict[str, float] = field(default_factory=dict)
    task_columns: str | None = None
    """Every column of the data set row the task came from, as a JSON object (dataset domains;
    None for generated ones): `SELECT json_extract_string(task_columns, '$.question') ...`."""
    extracted: str | None = None
    """The answer the verifier graded, as extracted from the completion (None: no extraction)."""
    loss_mask: list[int] | None = None
    """Multi-turn episodes: 1 on the tokens the model sampled, 0 on observation tokens (None: single turn)."""
    turns: list[dict] | None = None
    """Multi-turn episodes: every turn as {role, text, tokens, tool, status, seconds}; `completion`
    is then the final answer. `SELECT t.tool, t.status FROM rollouts, unnest(turns) AS u(t)`."""
    end_reason: str | None = None
    """Why the episode ended: done | max_turns | context | length (None: single turn)."""
    tool_calls: int | None = None
    tool_errors: int | None = None
    """Tool calls of the episode, and those whose status was not ok (None: single turn)."""
    reward_logs: str | None = None
    """What reward functions logged for this sample with TRL's `log_extra`, as a JSON object
    (None: nothing): `SELECT json_extract_string(reward_logs, '$.answer_parsed') ...`."""

    @classmethod
    def from_sample(cls, run: str, step: int, index: int, sample) -> RolloutRow:
        """`sample` is a `postrl.records.Sample` (not imported: records pulls in torch)."""
        score: Score | None = sample.score
        return cls(
            run=run,
            step=step,
            policy_version=sample.policy_version,
            domain=sample.task.domain,
            task_id=sample.task.task_id,
            level=sample.task.level,
            group=sample.group,
            sample=index,
            prompt=sample.task.prompt,
            answer=sample.task.answer,
            prompt_ids=list(sample.prompt_ids),
            completion=sample.text,
            token_ids=list(sample.completion_ids),
            behaviour_logprobs=[float(x) for x in sample.logprobs],
            reward=None if score is None else float(score.reward),
            reward_components=stored_components(sample),
            verifier_status=None if score is None else score.status,
            correct=None if score is None else score.correct,
            detail="" if score is None else score.detail,
            advantage=float(sample.advantage),
            finish_reason=sample.finish_reason,
            temperature=float(sample.temperature),
            timings={k: float(v) for k, v in sample.timings.items()},
            task_columns=_row_json(sample.task),
            extracted=None if score is None else score.extracted,
            reward_logs=json.dumps(score.logged, ensure_ascii=False, default=str) if score and score.logged else None,
            **_episode_columns(sample),
        )

    def to_sample(self):
        """Rebuild a `Sample` for replay. Of the task's `meta` only the data set row comes back (`row`)."""
        from postrl.records import Sample  # lazy: keeps torch out of store readers

        meta = {} if self.task_columns is None else {"row": json.loads(self.task_columns)}
        task = Task(self.domain, self.task_id, self.prompt, self.answer, level=self.level, meta=meta)
        score = None
        if self.reward is not None:
            score = Score(
                reward=self.reward,
                correct=self.correct,
                status=self.verifier_status or "ok",
                components=dict(self.reward_components),
                detail=self.detail,
                extracted=self.extracted,
                logged=json.loads(self.reward_logs) if self.reward_logs else {},
            )
        return Sample(
            task=task,
            group=self.group,
            prompt_ids=list(self.prompt_ids),
            completion_ids=list(self.token_ids),
            logprobs=list(self.behaviour_logprobs),
            text=self.completion,
            finish_reason=self.finish_reason,
            temperature=self.temperature,
            policy_version=self.policy_version,
            score=score,
            advantage=self.advantage,
            timings=dict(self.timings),
            loss_mask=None if self.loss_mask is None else list(self.loss_mask),
            episode=self._episode(),
        )

    def _episode(self):
        from postrl.records import Episode, Turn

        if self.turns is None:
            return None
        final = next((t["text"] for t in reversed(self.turns) if t["role"] == "assistant"), "")
        return Episode([Turn(**t) for t in self.turns], self.end_reason or "", final_text=final)


def _episode_columns(sample) -> dict:
    episode = sample.episode
    if episode is None:
        return {}
    return {"loss_mask": list(sample.loss_mask) if sample.loss_mask is not None else None,
            "turns": [vars(t).copy() for t in episode.turns], "end_reason": episode.end_reason,
            "tool_calls": episode.tool_calls, "tool_errors": episode.tool_errors}


_MAP_COLUMNS = ("reward_components", "timings")


def _row_json(task: Task) -> str | None:
    row = task.meta.get("row") if isinstance(task.meta, dict) else None
    return None if row is None else json.dumps(row, ensure_ascii=False, default=str)


def rows_to_table(rows: Sequence[RolloutRow]) -> pa.Table:
    columns = {f.name: [getattr(r, f.name) for r in rows] for f in fields(RolloutRow)}
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def table_to_rows(table: pa.Table) -> list[RolloutRow]:
    out = []
    for rec in table.to_pylist():
        for name in _MAP_COLUMNS:  # Arrow hands maps back as [(key, value), ...]
            rec[name] = dict(rec[name] or [])
        out.append(RolloutRow(**rec))
    return out


def shard_name(step: int) -> str:
    return f"step_{step:08d}.parquet"


def shard_steps(run_dir: str | Path) -> list[int]:
    """Steps that have a complete shard, ascending."""
    d = Path(run_dir) / SHARD_DIR
    if not d.is_dir():
        return []
    steps = [int(m.group(1)) for p in d.iterdir() if (m := _SHARD_RE.match(p.name))]
    return sorted(steps)


def read_table(run_dir: str | Path, steps: Sequence[int] | None = None) -> pa.Table:
    """All rows (or those of `steps`) as one Arrow table, ordered by step then sample."""
    d = Path(run_dir) / SHARD_DIR
    wanted = shard_steps(run_dir) if steps is None else sorted(set(steps) & set(shard_steps(run_dir)))
    tables = [pq.read_table(d / shard_name(s), schema=SCHEMA) for s in wanted]
    if not tables:
        return SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by([("step", "ascending"), ("sample", "ascending")])


def read_rows(run_dir: str | Path, steps: Sequence[int] | None = None) -> list[RolloutRow]:
    return table_to_rows(read_table(run_dir, steps))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RolloutStore:
    """Writer for one run's rollouts. One writer per run directory at a time."""

    def __init__(self, run_dir: str | Path, run: str | None = None):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / SHARD_DIR
        self.run = run if run is not None else self.run_dir.resolve().name
        self.dir.mkdir(parents=True, exist_ok=True)
        # Temp files are only left behind by a writer that was killed; nobody else writes here.
        for p in self.dir.iterdir():
            if _TMP_RE.match(p.name):
                p.unlink(missing_ok=True)

    def write(self, step: int, samples: Sequence) -> Path:
        """Write `samples` (a step's `Sample`s, in order) as the shard of `step`, atomically."""
        rows = [RolloutRow.from_sample(self.run, step, i, s) for i, s in enumerate(samples)]
        table = rows_to_table(rows)
        final = self.dir / shard_name(step)
        tmp = self.dir / f".{final.name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            crash_point("store.write")  # shard written to its temp file, not yet renamed
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.dir)
        return final

    def last_step(self) -> int | None:
        steps = shard_steps(self.run_dir)
        return steps[-1] if steps else None

    def truncate_after(self, step: int | None) -> list[int]:
        """Drop shards of steps > `step` (None drops all); returns the dropped steps. For resume."""
        dropped = [s for s in shard_steps(self.run_dir) if step is None or s > step]
        for s in dropped:
            (self.dir / shard_name(s)).unlink(missing_ok=True)
        if dropped:
            _fsync_dir(self.dir)
        return dropped

    def read_rows(self, steps: Sequence[int] | None = None) -> list[RolloutRow]:
        return read_rows(self.run_dir, steps)


def stored_components(sample) -> dict[str, float]:
    """The reward's components as stored: the score's, plus the KL penalty the learner took off
    the reward (`rl.kl_in: reward`) as `kl_penalty`."""
    out = {} if sample.score is None else {k: float(v) for k, v in sample.score.components.items()}
    if sample.kl_penalty is not None and sample.score is not None:
        out["kl_penalty"] = -float(sample.kl_penalty)
    return out
