"""A reward given as a Python callable (`postrl.train(reward_funcs=[f])`): a reward term that runs
in the trainer's process, since a callable (a closure, a lambda, a bound method) may not pickle.

    def brevity(prompts, completions, answer, **columns) -> list[float | None]: ...

    term = CallableTerm(brevity)                     # registered for one run as the term `brevity`
    scores = term(tasks, responses)                  # one Score per response

The signature and the call are TRL's and `python:MODULE:FUNCTION`'s (`postrl.rewards.user_reward`):
batched over one prompt's group, `prompts` and `completions` chat messages for a chat domain and
strings otherwise, every dataset column as a keyword (one entry per completion), TRL's `log_extra`
and `log_metric` when the function takes them. The statuses are that verifier's too: each call runs
in a thread with a deadline of `timeout_s`; past it the group's samples get `timeout` (the thread
cannot be killed: it is left behind, a daemon, and the run goes on), an exception gives `error`
naming it, and a return that is not one number or None per completion gives `error`. None is TRL's
"does not apply" (`not_applicable`: left out of the reward's sum); NaN and inf are "could not
verify" (`error`). Nothing it does ends the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from postrl.records import Response, Score, Task
from postrl.rewards.user_reward import (
    RewardLogs,
    call_reward,
    group_scores,
    groups_by_task,
    plain_value,
    trl_arguments,
)
from postrl.rewards.verifiers import VerifierSettings

TIMEOUT_S = VerifierSettings.timeout_s
"""The deadline of one call, as for `python:MODULE:FUNCTION` (its default)."""


class CallableTerm:
    """A TermFn (tasks, responses) -> list[Score] around a user's callable."""

    def __init__(self, fn: Callable, timeout_s: float = TIMEOUT_S, name: str = ""):
        self.fn, self.timeout_s = fn, timeout_s
        self.name = name or getattr(fn, "__name__", "") or type(fn).__name__

    def __call__(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        scores: list[Score | None] = [None] * len(tasks)
        for idx in groups_by_task(tasks):
            args = trl_arguments([tasks[i] for i in idx], [responses[i] for i in idx])
            for i, score in zip(idx, self._group(args, len(idx))):
                scores[i] = score
        return scores  # type: ignore[return-value]  (every index is in one group)

    def _group(self, args: dict, n: int) -> list[Score]:
        logs = RewardLogs()
        status, values, detail = self._call(args, logs)
        if status != "ok":
            return [Score(0.0, None, status, {}, detail) for _ in range(n)]  # composite names the term
        return group_scores([plain_value(v) for v in values], logs.as_dict(), n, self.name)

    def _call(self, args: dict, logs: RewardLogs) -> tuple[str, list, str]:
        """(status, values, detail) of one call, in a daemon thread with the deadline."""
        box: dict = {}

        def target() -> None:
            try:
                box["value"] = call_reward(self.fn, args, logs)
            except BaseException as e:  # noqa: BLE001 - any failure of the user's reward is a status
                box["error"] = e

        thread = threading.Thread(target=target, name=f"reward-{self.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            return "timeout", [], f"no answer within {self.timeout_s:g}s (the call is abandoned)"
        if "error" in box:
            e = box["error"]
            return "error", [], f"{type(e).__name__}: {e}"[:300]
        return "ok", box["value"], ""
