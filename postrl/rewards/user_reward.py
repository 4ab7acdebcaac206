"""`python:MODULE:FUNCTION`: a user's reward function, called TRL-style in supervised workers.

    # my_rewards.py, next to the recipe or importable
    def brevity(prompts, completions, answer, **columns):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    domains: {qa: {type: dataset, params: {path: qa.jsonl, prompt: "{q}", verifier: "python:my_rewards:brevity"}}}

The function is batched: `f(prompts, completions, **columns) -> list[float | None]`, one value
per completion, where `columns` holds every column of the dataset rows, one list entry per
completion. It is called once per prompt's group of samples. For a chat domain (`system:` or
`messages:` set), prompts are the chat messages and completions `[{"role": "assistant",
"content": ...}]`, as TRL passes them; otherwise both are plain strings.

It runs in `postrl.rewards.workers.pool` worker processes (your own code, so not confined), each call
with a deadline of `timeout_s`. Nothing it does ends the run: a call that hangs past its deadline
gives status `timeout` to its samples, one that raises gives `error` with the exception, and a
return that is not one number (or None) per completion gives `error` ("returned 3 values for 4
completions", "value 'x' is not a number"). None, inf and NaN are "could not verify" (status
error). A sample counts as correct when its reward is at least 1 (full marks); its reward is the
component `user`.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Sequence
from numbers import Real

from postrl.records import Response, Score, Task
from postrl.rewards.extract import make_extractor
from postrl.rewards.verifiers import VERIFIERS, VerifierSettings
from postrl.rewards.workers.pool import WorkerPool

HANDLER = "postrl.rewards.user_reward:call_job"
COMPONENTS = ("user",)
RESERVED = ("prompts", "completions")

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


def call_job(job: dict) -> list:
    """Worker-side: call the function on one group; each value as a float, None, or a note
    saying what it was (the parent turns notes into per-sample errors)."""
    values = _function(job["prompts"], job["completions"], **job["columns"])
    return [plain_value(v) for v in list(values)]


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
        values = outcome.value
        if not isinstance(values, list) or len(values) != n:
            got = len(values) if isinstance(values, list) else type(values).__name__
            return [Score(0.0, None, "error", {}, f"{self.function} returned {got} values for {n} completions")
                    for _ in range(n)]
        return [value_score(v, self.function) for v in values]

    def close(self) -> None:
        self.pool.close()


def value_score(v, function: str) -> Score:
    if isinstance(v, dict):
        return Score(0.0, None, "error", {}, f"{function}: value {v['bad']} is not a number")
    if v is None or not math.isfinite(v):
        return Score(0.0, None, "error", {}, f"{function}: no reward ({v})")
    return Score(v, v >= 1.0, "ok", {"user": v})


VERIFIERS.add("python", UserReward, components=COMPONENTS, needs_answer=False, check_argument=check_python_function)
