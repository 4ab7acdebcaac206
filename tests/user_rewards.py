"""User reward functions for `python:user_rewards:NAME` verifiers in the tests (loaded by pool
workers from this directory, the recipe's `base_dir` in the tests)."""

import time


def match(prompts, completions, answer, **columns):
    """1 when the completion (a string, or the content of a chat reply) is the reference answer."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if t.strip() == a else 0.0 for t, a in zip(texts, answer)]


def chat_shape(prompts, completions, **columns):
    """1 when prompts are chat messages and completions assistant turns, as TRL passes them."""
    return [float(isinstance(p, list) and p[-1]["role"] == "user" and c[0]["role"] == "assistant")
            for p, c in zip(prompts, completions)]


def hang(prompts, completions, **columns):
    if any("hang" in c for c in completions):
        time.sleep(600)
    return [0.5] * len(completions)


def boom(prompts, completions, **columns):
    raise RuntimeError("user reward failed")


def garbage(prompts, completions, **columns):
    if completions[0] == "short":
        return [1.0]  # one value whatever the number of completions
    return ["high" if c == "word" else None for c in completions]


def trl_logged(completions, answer, log_extra=None, log_metric=None, **kwargs):
    """TRL's shape: completions first, by keyword; None for an empty reply; logs a column and a metric."""
    log_extra("reply", list(completions))
    log_metric("calls", 1.0)
    return [None if not c else float(c == a) for c, a in zip(completions, answer)]
