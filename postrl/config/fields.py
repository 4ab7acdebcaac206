"""What a config field's value may be beyond its type: a range, a choice, not empty.

Declared beside the field (`total_steps: int = ranged(60, ge=1)`, a `Literal[...]` type, or
`ALLOWED` metadata), checked by `postrl.config.loading.from_dict` as the tree is built and shown in
the config reference's `allowed` column (docs/hooks.py).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

ALLOWED = "allowed"
"""Field metadata key: what a field's value (each item, for a list) must be, checked by `from_dict`."""


@dataclass(frozen=True)
class Range:
    """Numbers at least `ge` (or above `gt`) and at most `le`; None leaves that end open. NaN is in no range."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def __contains__(self, x: Any) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le))

    def __str__(self) -> str:  # ">= 1", "> 0", "in (0, 1]": what the config reference shows
        low, closed = (self.ge, True) if self.gt is None else (self.gt, False)
        if self.le is None:
            return f"{'>=' if closed else '>'} {low}"
        return f"in {'[' if closed else '('}{low}, {self.le}]"

    def error(self) -> str:
        return f"must be {self}"


@dataclass(frozen=True)
class Choice:
    """One of `names` (a `Literal` field's are its arguments); with `sep`, what comes before the
    first `sep` must be one of them (run.device: cuda:1)."""

    names: tuple[str, ...]
    sep: str = ""

    def __contains__(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        return (value.split(self.sep, 1)[0] if self.sep else value) in self.names

    def __str__(self) -> str:  # "loss or reward", "online, offline or disabled (or empty)"
        shown = [n for n in self.names if n]
        text = " or ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
        return text + (" (or empty)" if "" in self.names else "")

    def error(self) -> str:
        return f"expected {self}"


class NonEmpty:
    """A string or list with something in it (a stop string)."""

    def __contains__(self, value: Any) -> bool:
        return len(value) > 0

    def __str__(self) -> str:
        return "not empty"

    def error(self) -> str:
        return "must not be empty"


def ranged(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Any:
    """A field whose value must lie in a range: `total_steps: int = ranged(60, ge=1)`."""
    return field(default=default, metadata={ALLOWED: Range(ge, gt, le)})


def allowed_of(tp: Any, f: dataclasses.Field) -> Range | Choice | NonEmpty | None:
    """What field `f` (of type `tp`) allows beyond its type: its `Literal` choices or its `ALLOWED`
    metadata; None = any value of the type. The config reference (docs/hooks.py) shows it too."""
    if typing.get_origin(tp) is Literal:
        return Choice(typing.get_args(tp))
    return f.metadata.get(ALLOWED)
