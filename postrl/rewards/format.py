"""Answer-format and shaping terms, registered by name for composite rewards.

    >>> boxed_answer("so x = \\\\boxed{\\\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> tagged_answer("<think>hm</think><answer> 42 </answer>")
    '42'
    >>> follows_think_answer("<think>hm</think>\\n<answer>42</answer>")
    True

Terms are indicators in [0, 1]; the recipe's weight carries the sign, so a penalty is written
with a negative weight: `{reward: 1.0, overlong: -0.5}`.
"""

from __future__ import annotations

import re

from postrl.rewards.terms import register_term

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_ANSWER = re.compile(r"\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*",
                           re.DOTALL)


def boxed_answer(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent/unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def tagged_answer(text: str) -> str | None:
    """Stripped content of the last `<answer>...</answer>`; None if there is none."""
    found = _TAG.findall(text)
    return found[-1].strip() if found else None


def follows_think_answer(text: str) -> bool:
    """Exactly `<think>...</think>` then a non-empty `<answer>...</answer>`, nothing else around."""
    return _THINK_ANSWER.fullmatch(text) is not None


@register_term("format_boxed")
def format_boxed(tasks, responses) -> list[float]:
    """1 when the completion ends its reasoning with a non-empty, closed `\\boxed{}`."""
    return [float(bool((boxed_answer(r.text) or "").strip())) for r in responses]


@register_term("format_answer_tag")
def format_answer_tag(tasks, responses) -> list[float]:
    """1 when the completion contains exactly one non-empty `<answer>...</answer>`."""
    return [float(len(_TAG.findall(r.text)) == 1 and bool(tagged_answer(r.text))) for r in responses]


@register_term("format_think_answer")
def format_think_answer(tasks, responses) -> list[float]:
    """1 for the R1-style layout `<think>...</think><answer>...</answer>` and nothing else."""
    return [float(follows_think_answer(r.text)) for r in responses]


@register_term("overlong")
def overlong(tasks, responses) -> list[float]:
    """1 when the completion was cut at max_new_tokens (finish_reason 'length'): it never finished
    its answer, so a negative weight discourages rambling (DAPO's overlong penalty, hard form)."""
    return [float(r.finish_reason == "length") for r in responses]


@register_term("length")
def length(tasks, responses) -> list[float]:
    """Completion length in characters, divided by 10 and capped at 1: a verbosity bonus.

    Gameable on purpose: a policy can earn it without being right. recipes/hacking.yaml uses it to
    show the monitors catching a reward that rises while the verifier's pass rate falls."""
    return [min(len(r.text) / 10.0, 1.0) for r in responses]
