"""The registry of reward terms: shaping terms that composite rewards add by name.

    @register_term("overlong")
    def overlong(tasks, responses) -> list[float]: ...

A term module registers into `TERMS` when imported; `postrl.rewards.composite` imports the
built-in ones (`format`, `math`), a reward model registers its term for one run
(`postrl.rewards.models.rm.register_rm_term`). This module knows no term: it is the leaf they share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from postrl.records import Score
from postrl.registry import Registry

TermFn = Callable[[Sequence, Sequence], Sequence[float] | Sequence[Score]]
"""(tasks, responses) -> one float per response, or one Score when the term can fail to verify
(its non-ok status then becomes the composite's status: never a silent zero)."""

OWN_REWARD = "reward"
"""The pseudo-term for the domain's own reward: reserved, no term may take its name."""

TERMS = Registry("reward term")
"""Name -> TermFn. The config key varies (`domains.NAME.reward.TERM`), so callers pass it."""


def register_term(name: str) -> Callable[[TermFn], TermFn]:
    """Decorator: `@register_term("name")`; the name `reward` is reserved for the domain's own."""
    if name == OWN_REWARD:
        raise ValueError(f"reward term {name!r} is reserved for the domain's own reward")
    return TERMS.register(name)
