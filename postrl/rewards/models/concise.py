"""The project's own preference rule: a reply that answers, and stays short, beats one that is long,
evasive or wrong. It makes preference sets (`postrl rm make-prefs --set concise`), labels pairs of a
policy's own samples (`benchmarks/rm_overoptimization.py`), and is a gold scorer a domain can
attach for monitoring (`gold: python:postrl.rewards.models.concise:concise`).

    >>> concise_gold("68.", "68"), concise_gold("I am not sure.", "68"), concise_gold("67.", "68")
    (1.0, 0.0, 0.0)
    >>> round(concise_gold("Let me think about it carefully, step by step. So it is 68.", "68"), 3)
    0.271

The answer is the reply's last number (thousands separators dropped), so padding with numbers
after it loses it. Within `budget(answer)` characters the score is 1; past it, it falls as
budget / length: twice the budget halves it.
"""

from __future__ import annotations

import random
import re

from postrl.rewards.models.preferences import Pair

_NUMBER = re.compile(r"-?\d+")


def budget(answer: str) -> int:
    """Characters a short reply may take: the answer and a few words around it."""
    return 2 * len(answer) + 12


def concise_gold(reply: str, answer: str) -> float:
    """1 for a short right answer, less the longer it runs, 0 for a wrong or missing one."""
    found = _NUMBER.findall(reply.replace(",", ""))
    if not found or found[-1] != answer.strip():
        return 0.0
    length = len(reply.strip())
    return min(1.0, budget(answer) / max(length, 1))


def concise(prompts, completions, answer, **columns) -> list[float]:
    """`concise_gold` as a TRL-style reward function (`python:postrl.rewards.models.concise:concise`)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [concise_gold(t, str(a)) for t, a in zip(texts, answer)]


_FILLER = [
    "Let me think about this step by step.", "This is a question about arithmetic.",
    "We need to be careful with the digits here.", "First, look at both numbers.",
    "Adding and subtracting are things we do every day.", "There are many ways to solve this.",
]
_EVASIVE = ["I'm not sure, could you rephrase the question?", "I cannot answer that right now.",
            "That depends on what you mean.", "Sorry, I don't know."]


def _replies(rng: random.Random, right: int) -> list[str]:
    wrong = right + rng.choice([-10, -2, -1, 1, 2, 10])
    long = " ".join(rng.sample(_FILLER, rng.randint(2, 4)))
    return [f"{right}.", f"The answer is {right}.", f"{long} So the answer is {right}.",
            rng.choice(_EVASIVE), f"{wrong}.", f"The answer is {wrong}."]


def make_concise_preferences(n: int, seed: int = 0) -> list[Pair]:
    """Chat pairs on small arithmetic questions, chosen and rejected ranked by `concise_gold` (ties
    never paired): short right answers over long right ones over evasive or wrong ones."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    while len(pairs) < n:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-")
        right = a + b if op == "+" else a - b
        prompt = ({"role": "user", "content": f"What is {a} {op} {b}?"},)
        x, y = rng.sample(_replies(rng, right), 2)
        gx, gy = concise_gold(x, str(right)), concise_gold(y, str(right))
        if gx == gy:
            continue
        chosen, rejected = (x, y) if gx > gy else (y, x)
        pairs.append(Pair(prompt, ({"role": "assistant", "content": chosen},),
                          ({"role": "assistant", "content": rejected},)))
    return pairs
