"""`python:MODULE:FUNCTION`: a user's reward function, called TRL-style in supervised workers.

    # my_rewards.py, next to the recipe or importable
    def brevity(prompts, completions, answer, **columns):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    domains: {qa: {type: dataset, params: {path: qa.jsonl, prompt: "{q}", verifier: "python:my_rewards:brevity"}}}

The function is batched: `f(prompts, completions, **columns) -> list[float | None]`, one value
per completion, where `columns` holds every column of the dataset rows, one list entry per
completion. It is called once per prompt's group of samples, as TRL calls it: `prompts`,
`completions` and the columns by keyword (a function whose first two parameters have other names,
`f(p, c, **columns)`, gets the first two by position), plus TRL's `log_extra(column, values)` and
`log_metric(name, value)` when its signature takes them (by name or `**kwargs`). For a chat domain
(`system:` or `messages:` set), prompts are the chat messages and completions `[{"role":
"assistant", "content": ...}]`, as TRL passes them; otherwise both are plain strings.

It runs in `postrl.rewards.workers.pool` worker processes (your own code, so not confined), each call
with a deadline of `timeout_s`. Nothing it does ends the run: a call that hangs past its deadline
gives status `timeout` to its samples, one that raises gives `error` with the exception, and a
return that is not one number (or None) per completion gives `error` ("returned 3 values for 4
completions", "value 'x' is not a number"). None is TRL's "does not apply to this sample": status
`not_applicable`, left out of the reward's sum (`postrl.rewards.composite`), so a sample nothing
applies to is unverified and gets zero advantage; inf and NaN are "could not verify" (error). A
sample counts as correct when its reward is at least 1 (full marks); its reward is the component
`user`.

What the function logs: each `log_extra` column gives every sample of the group its value (stored
with the sample, `reward_logs` in the rollout store; one value per completion, else `error`); each
`log_metric` value, averaged over the step, is the metric `reward_fn/FUNCTION/NAME`; and the
function's own values where they applied average to `reward_fn/FUNCTION` (TRL's per-function mean).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import sys
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

from postrl.records import NOT_APPLICABLE, Response, Score, Task
from postrl.rewards.extract import make_extractor
from postrl.rewards.verifiers import VERIFIERS, VerifierSettings
from postrl.rewards.workers.pool import WorkerPool

HANDLER = "postrl.rewards.user_reward:call_job"
COMPONENTS = ("user",)
HOOKS = ("log_extra", "log_metric")
"""TRL's logging callables, given to a function whose signature takes them."""
RESERVED = ("prompts", "completions", *HOOKS)
METRIC = "reward_fn"
"""The prefix of the metrics a reward function adds to a step's (`reward_fn/FUNCTION[/NAME]`)."""

_function = None
"""In a worker: the user's function, loaded by `warmup` before the first job."""


def load_function(spec: str, paths: Sequence[str] = ()) -> Callable:
    """The function `MODULE:FUNCTION` names, importing MODULE with `paths` searched first."""
    module, _, name = spec.partition(":")
    added = [p for p in paths if p and p not in sys.path]
    sys.path[:0] = added
    try:
        fn = getattr(importlib.import_module(module), name, None)
    finally:
        for p in added:
            sys.path.remove(p)
    if not callable(fn):
        raise AttributeError(f"module {module} has no function {name}")
    return fn


def check_python_function(arg: str, base_dir: str) -> str:
    """'' when `arg` is MODULE:FUNCTION naming a function that imports, else what is wrong."""
    module, _, function = arg.partition(":")
    if not module or not function:
        return "expected python:MODULE:FUNCTION"
    try:
        load_function(arg, [base_dir])
    except Exception as e:  # noqa: BLE001 - any failure to import the user's module is reported as such
        return f"cannot load {arg}: {type(e).__name__}: {e}"
    return ""


def warmup(function: str, paths: list[str]) -> None:
    global _function
    _function = load_function(function, paths)


def call_job(job: dict) -> dict:
    """Worker-side: call the function on one group; each value as a float, None, or a note
    saying what it was (the parent turns notes into per-sample errors), and what it logged."""
    logs = RewardLogs()
    values = call_reward(_function, job, logs)
    return {"values": [plain_value(v) for v in values], "logs": logs.as_dict()}


class RewardLogs:
    """What a reward function logged in one call through TRL's `log_extra` and `log_metric`."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {}
        self.metrics: dict[str, list[float]] = {}

    def log_extra(self, column: str, values: list) -> None:
        """TRL's: a column for the completions table, one value per completion (JSON-safe copies)."""
        self.columns.setdefault(str(column), []).extend(json.loads(json.dumps(list(values), default=str)))

    def log_metric(self, name: str, value: float) -> None:
        """TRL's: a scalar for this call, averaged into the step's metrics."""
        self.metrics.setdefault(str(name), []).append(float(value))

    def as_dict(self) -> dict[str, dict]:
        return {"columns": self.columns, "metrics": self.metrics}


def call_reward(fn: Callable, args: dict, logs: RewardLogs) -> list:
    """`fn` on one group's `trl_arguments`, called as TRL calls a reward function (see the module
    docstring), with `logs`' callables when it takes them."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): positional, no hooks
        params = []
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    kwargs = {**args["columns"], **{h: getattr(logs, h) for h in HOOKS if h in names or any_keyword}}
    if {"prompts", "completions"} & names:
        return list(fn(prompts=args["prompts"], completions=args["completions"], **kwargs))
    return list(fn(args["prompts"], args["completions"], **kwargs))


def plain_value(v):
    if v is None or isinstance(v, bool):
        return None if v is None else {"bad": repr(v)[:60]}
    if isinstance(v, Real):
        return float(v)
    return {"bad": repr(v)[:60]}


def groups_by_task(tasks: Sequence[Task]) -> list[list[int]]:
    """Indices of each prompt's samples, in first-seen order: a user reward is called per group."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault(t.task_id, []).append(i)
    return list(groups.values())


def trl_arguments(tasks: Sequence[Task], responses: Sequence[Response]) -> dict:
    """`prompts`, `completions` and the dataset columns of one group, as TRL passes them: chat
    messages for a chat domain, strings otherwise; every column one entry per completion."""
    chat = bool(tasks[0].meta.get("conversational")) and tasks[0].messages is not None
    prompts = [list(t.messages) if chat else t.prompt for t in tasks]
    completions = [[{"role": "assistant", "content": r.text}] if chat else r.text for r in responses]
    names = [c for c in tasks[0].meta.get("row", {}) if c not in RESERVED]
    columns = {c: [t.meta.get("row", {}).get(c) for t in tasks] for c in names}
    return {"prompts": prompts, "completions": completions, "columns": columns}


class UserReward:
    def __init__(self, arg: str, settings: VerifierSettings):
        self.function = arg
        self.extract_spec = settings.extract or "none"
        self.extractor = make_extractor(self.extract_spec, "domains.NAME.params.extract")
        self.pool = WorkerPool(HANDLER, workers=settings.workers or None, timeout_s=settings.timeout_s,
                               confine=False, options={"function": arg, "paths": [settings.base_dir]})

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        groups = groups_by_task(tasks)
        jobs = [self._job([tasks[i] for i in idx], [responses[i] for i in idx]) for idx in groups]
        try:
            outcomes = self.pool.map(jobs)
        except RuntimeError as e:  # the workers could not start (the module fails to import there)
            return [Score(0.0, None, "error", {}, f"{self.function}: {e}") for _ in tasks]
        scores: list[Score | None] = [None] * len(tasks)
        for idx, outcome in zip(groups, outcomes):
            for i, score in zip(idx, self._scores(outcome, len(idx))):
                score.extracted = self.extractor(responses[i].text)
                scores[i] = score
        return scores  # type: ignore[return-value]  (every index is in one group)

    def _job(self, tasks: list[Task], responses: list[Response]) -> dict:
        return trl_arguments(tasks, responses)

    def _scores(self, outcome, n: int) -> list[Score]:
        if outcome.status != "ok":
            return [Score(0.0, None, outcome.status, {}, f"{self.function}: {outcome.detail}") for _ in range(n)]
        return group_scores(outcome.value["values"], outcome.value["logs"], n, self.function)

    def close(self) -> None:
        self.pool.close()


def group_scores(values: list, logs: dict[str, dict], n: int, function: str) -> list[Score]:
    """One Score per completion of a group, from the function's values (`plain_value`s) and what it
    logged (`RewardLogs.as_dict`): the logged columns and metrics go with each sample's Score."""
    short = function.rsplit(":", 1)[-1]
    if len(values) != n:
        return [Score(0.0, None, "error", {}, f"{function} returned {len(values)} values for {n} completions")
                for _ in range(n)]
    uneven = next((c for c, column in logs["columns"].items() if len(column) != n), None)
    if uneven is not None:
        return [Score(0.0, None, "error", {}, f"{function}: log_extra({uneven!r}) gave "
                                              f"{len(logs['columns'][uneven])} values for {n} completions")
                for _ in range(n)]
    metrics = {f"{METRIC}/{short}/{name}": sum(v) / len(v) for name, v in logs["metrics"].items()}
    scores = []
    for i, v in enumerate(values):
        score = value_score(v, function)
        score.logged = {c: column[i] for c, column in logs["columns"].items()}
        score.metrics = {**metrics, **({f"{METRIC}/{short}": score.reward} if score.status == "ok" else {})}
        scores.append(score)
    return scores


def value_score(v: Any, function: str) -> Score:
    if isinstance(v, dict):
        return Score(0.0, None, "error", {}, f"{function}: value {v['bad']} is not a number")
    if v is None:
        return Score(0.0, None, NOT_APPLICABLE, {}, f"{function}: does not apply (None)")
    if not math.isfinite(v):
        return Score(0.0, None, "error", {}, f"{function}: no reward ({v})")
    return Score(v, v >= 1.0, "ok", {"user": v})


VERIFIERS.add("python", UserReward, components=COMPONENTS, needs_answer=False, check_argument=check_python_function)
