"""The record every reward function returns.

A `Score` separates "wrong" (correct=False, status "ok") from "could not verify"
(correct=None, status "timeout" or "error"): the trainer never turns the latter into a
silent zero without it being counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("ok", "timeout", "error")


@dataclass
class Score:
    reward: float
    """Scalar reward used for the advantage."""
    correct: bool | None
    """Verifier verdict; None when the verifier could not decide."""
    status: str = "ok"
    """ok | timeout | error: whether the verifier itself ran to completion."""
    components: dict[str, float] = field(default_factory=dict)
    """Named reward terms that make up `reward` (logged separately)."""
    detail: str = ""
    """Short human-readable note (e.g. an error message), for spot checks."""
