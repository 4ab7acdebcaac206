"""A test environment, loaded by recipes as an extension (`imports: [tests/agent_envs.py]`):
`two_turn_arith` plays arith problems over two turns, the first answered by a fixed user turn,
so a tiny character model plays real multi-turn episodes (its turns end at a digit)."""

from __future__ import annotations

from postrl.tasks.base import register_domain
from postrl.tasks.catalog import make_domain
from postrl.tasks.env import opening_messages, score_by_episode


@register_domain("two_turn_arith")
class TwoTurnArith:
    max_turns = 2
    stop = tuple("0123456789")

    def __init__(self, params: dict, seed: int, name: str = "two_turn_arith"):
        self.name, self.inner = name, make_domain("arith", params, seed, name)
        self.levels = self.inner.levels
        self.reward_components = getattr(self.inner, "reward_components", ())

    def sample(self, rng, level=None):
        return self.inner.sample(rng, level)

    def heldout(self, n):
        return self.inner.heldout(n)

    def score(self, tasks, responses):
        return self.inner.score(tasks, responses)

    def score_episodes(self, tasks, responses, episodes):
        return score_by_episode(self.inner, tasks, responses, episodes)

    def reset(self, task):
        return Echo(task)


class Echo:
    def __init__(self, task):
        self.messages, self.turns = opening_messages(task), 0

    def step(self, text):
        self.turns += 1
        return ([{"role": "user", "content": "+1="}], None, False) if self.turns == 1 else (None, None, True)
