"""Domain `mul`: multiply a 3-digit by a 2-digit number, a task a tiny model cannot do in its head.

    347*58=    ->  20126

Made for tool use (`tools: [calculator]`): the `tiny-calc` demo model's pretraining corpus
(`postrl.pretrain.CalcPretrainSpec`) sometimes answers by calling the calculator and copying
its result, and otherwise writes a product of its own (right only by luck):

    347*58=<tool_call>{"name":"calculator","arguments":{"expression":"347*58"}}</tool_call><tool_result>20126</tool_result>20126

Graded strictly on the final answer: the text after the last tool result (the whole text when
there is none), which must be exactly the product and end with EOS. A fixed ~10% of prompts (by
hash, independent of any seed) is held out and never sampled for training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from postrl.records import Response, Score, Task
from postrl.tasks.base import heldout_by_level, is_heldout, parse_params, register_domain, strict_score
from postrl.tools.base import RESULT_CLOSE

ALPHABET = "0123456789*="


@dataclass
class MulParams:
    heldout_percent: int = 10
    """Share of all prompts reserved for the held-out split, in percent."""


def generate(rng: random.Random) -> tuple[int, int]:
    return rng.randint(100, 999), rng.randint(10, 99)


def render(a: int, b: int) -> str:
    return f"{a}*{b}="


def final_answer(text: str) -> str:
    """The answer after the last tool result (the whole text without one), stripped."""
    return text.rsplit(RESULT_CLOSE, 1)[-1].strip()


@register_domain("mul")
class Mul:
    reward_components = ("correct",)

    def __init__(self, params: dict, seed: int, name: str = "mul"):
        self.name = name
        self.params: MulParams = parse_params(MulParams, params, name)
        self.levels = [1]

    def make_task(self, a: int, b: int) -> Task:
        prompt = render(a, b)
        return Task(self.name, f"mul/{prompt}", prompt, str(a * b), 1)

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        while True:
            a, b = generate(rng)
            if not is_heldout(render(a, b), self.params.heldout_percent):
                return self.make_task(a, b)

    def heldout(self, n: int) -> list[Task]:
        def draw(rng: random.Random, level: int):
            a, b = generate(rng)
            return render(a, b), lambda: self.make_task(a, b)

        return heldout_by_level(self.name, self.levels, n, self.params.heldout_percent, draw, tries=200)

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return [strict_score(r, final_answer(r.text) == t.answer) for t, r in zip(tasks, responses)]
