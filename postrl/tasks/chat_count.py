"""Domain `chat_count`: reasoning-gym's letter counting, graded like `chat_arith`.

    How many times does the letter "d" appear in the text: "s to be done Shall we"?
    Reply with only the final number.                                     ->  1

reasoning-gym's own `rg:letter_counting` grader wants the reply to be exactly the number; an
instruction-tuned chat model answers "The letter "d" appears 1 time." and scores 0 everywhere,
which hides any change. Here the problems (and the held-out split) are reasoning-gym's, and the
grade is the last integer of a finished reply (`chat_arith.score_reply`). The benchmark uses it
as a second, *untrained* domain: a skill RL on arithmetic should not damage.
"""

from __future__ import annotations

import random

from postrl.records import Response, Score, Task
from postrl.tasks.base import register_domain
from postrl.tasks.chat_arith import score_reply
from postrl.tasks.rgym import ReasoningGymDomain

SUFFIX = " Reply with only the final number."


@register_domain("chat_count")
class ChatCount:
    reward_components = ("correct",)

    def __init__(self, params: dict, seed: int, name: str = "chat_count"):
        self.name = name
        params = {"heldout_size": 200, **params, "prompt_template": "{question}" + SUFFIX}
        self._rg = ReasoningGymDomain("letter_counting", params, seed)
        self.levels = self._rg.levels

    def _own(self, task: Task) -> Task:
        return Task(self.name, task.task_id.replace("rg:letter_counting", self.name), task.prompt, task.answer,
                    task.level, task.meta)

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        return self._own(self._rg.sample(rng, level))

    def heldout(self, n: int) -> list[Task]:
        return [self._own(t) for t in self._rg.heldout(n)]

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return [score_reply(t.answer, r) for t, r in zip(tasks, responses)]
