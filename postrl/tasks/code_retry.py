"""Domain type `code_retry`: the model writes code, the sandbox runs the tests, and the failure
comes back as the next user turn, for up to `retries` more attempts (failure fed back).

    domains:
      fix:
        type: code_retry
        params:
          domain: {type: code, params: {levels: [1, 2]}}   # the code domain whose tests grade an attempt
          retries: 2                                       # attempts after the first
          turn_cost: 0.05                                  # subtracted per retry used (component turn_cost)

Each attempt is graded by the inner domain (`code`, or a `dataset` domain with the `code`
verifier): its tests run in the sandbox. A passing attempt ends the episode; a failing one gets
the feedback turn: the judge's note (assertions held, the first failing one, a time or memory
limit) and the failing assert's line when the tests name it. The reward is the final attempt's,
plus the optional cost `-turn_cost x retries used`, logged as its own component `turn_cost`. An
attempt the sandbox could not judge (status timeout or error) ends the episode without a reward:
the domain grades the final answer again, and its status is kept.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from postrl.abilities import DeclaresComponents, check_abilities
from postrl.errors import UserError
from postrl.records import Episode as EpisodeRecord
from postrl.records import Response, Score, Task
from postrl.tasks.base import DOMAINS, parse_params, register_domain
from postrl.tasks.env import opening_messages, score_by_episode


@dataclass
class CodeRetryParams:
    domain: dict[str, Any] = field(default_factory=lambda: {"type": "code"})
    """The inner code domain: {type: code | dataset | ..., params: {...}}."""
    retries: int = 2
    """Attempts after the first one (the episode has at most retries + 1 assistant turns)."""
    turn_cost: float = 0.0
    """Reward subtracted per retry used (the component `turn_cost`, <= 0); 0 = off."""
    feedback: str = "Your code failed the tests: {error}\nFix it and reply with the whole corrected code."
    """The user turn after a failed attempt; {error} is the failure."""
    base_dir: str = ""
    """The recipe's directory (set by the catalog): the inner domain's relative paths resolve against it."""


@register_domain("code_retry", uses_base_dir=True)
class CodeRetry:
    stop: tuple[str, ...] = ()

    def __init__(self, params: dict, seed: int, name: str = "code_retry"):
        self.name = name
        self.params: CodeRetryParams = parse_params(CodeRetryParams, params, name)
        p = self.params
        if p.retries < 0:
            raise UserError(f"domains.{name}.params.retries = {p.retries}: must be >= 0")
        inner_type = p.domain.get("type", "code")
        factory = DOMAINS.get(inner_type, key=f"domains.{name}.params.domain.type")
        inner_params = dict(p.domain.get("params", {}))
        if DOMAINS.facts(inner_type).uses_base_dir and p.base_dir and "base_dir" not in inner_params:
            inner_params["base_dir"] = p.base_dir
        self.inner = factory(inner_params, seed, name)
        check_abilities(self.inner, f"domain {name} (its inner {inner_type})")
        self.levels = self.inner.levels
        self.max_turns = p.retries + 1
        inner_components = self.inner.reward_components if isinstance(self.inner, DeclaresComponents) else ()
        self.reward_components = (*inner_components, "turn_cost")

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        return self.inner.sample(rng, level)

    def heldout(self, n: int) -> list[Task]:
        return self.inner.heldout(n)

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return self.inner.score(tasks, responses)

    def reset(self, task: Task) -> CodeRetryEpisode:
        return CodeRetryEpisode(self, task)

    def score_episodes(self, tasks: list[Task], responses: list[Response],
                       episodes: list[EpisodeRecord | None]) -> list[Score]:
        return score_by_episode(self.inner, tasks, responses, episodes)

    def __getattr__(self, attr: str) -> Any:  # state_dict, sandbox_config, use_sandbox, close, ...
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


class CodeRetryEpisode:
    def __init__(self, env: CodeRetry, task: Task):
        self.env, self.task = env, task
        self.messages = opening_messages(task)
        self.attempts = 0
        self.correct: bool | None = None
        self.components: dict[str, float] = {}

    def step(self, assistant_text: str) -> tuple[list[dict] | None, float | None, bool]:
        self.attempts += 1
        p = self.env.params
        score = self.env.inner.score([self.task], [Response(assistant_text, "stop")])[0]
        final = self.attempts > p.retries
        if score.status != "ok":
            if final:
                return None, None, True  # graded again by the domain, with its status
        elif score.correct or final:
            self.correct = score.correct
            cost = -p.turn_cost * (self.attempts - 1)
            self.components = {**score.components, "turn_cost": cost}
            return None, score.reward + cost, True
        error = failure_message(self.task, score)
        return [{"role": "user", "content": p.feedback.format(error=error)}], None, False


def failure_message(task: Task, score: Score) -> str:
    """What went wrong, for the model: the judge's note, and the first failing assert's source."""
    note = score.detail.split(" | ", 1)[0]
    m = re.search(r"first failure #(\d+)", note)
    test = task.meta.get("test") or task.meta.get("tests") or ""
    if m and isinstance(test, str):
        asserts = [line.strip() for line in test.splitlines() if line.strip().startswith("assert")]
        k = int(m.group(1))
        if k < len(asserts):
            return f"{note}. Failing test: {asserts[k]}"
    return note or "the tests failed"
