"""One registry type for everything chosen by name in a recipe (domains, reward terms, monitors,
sinks, schedules, engines, losses, advantage estimators, KL estimators, loss aggregations, alert
actions, eval aggregates). A leaf: it imports nothing from postrl but `errors`.

    LOSSES = Registry("policy loss", key="rl.loss")

    @LOSSES.register("ppo_clip")
    def ppo_clip(...): ...

    LOSSES.get("ppo_clip")                 # the registered object
    LOSSES.get("foo")                      # ConfigError: config key 'rl.loss' = 'foo': unknown
                                           #   policy loss (expected one of: ppo_clip)
    LOSSES.check("foo", key="rl.loss")     # the same error without returning anything

`key` is the config key whose value names an entry; a registry whose names appear under several
keys (a reward term under `domains.NAME.reward`) passes the key to `get`/`check` instead. When the
name is the key's last part (a mapping's key, `domains.NAME.reward.TERM`), the error names it once.

An entry may carry facts about itself, typed by the registry's `facts` dataclass, so that what is
known of an entry lives with its registration and not as attributes stuck onto the object:

    VERIFIERS = Registry("verifier", facts=VerifierFacts)
    VERIFIERS.add("code", CodeVerifier, components=CODE_COMPONENTS, needs_answer=False)
    VERIFIERS.facts("code").needs_answer   # False; an entry registered without facts has the defaults

A fact the dataclass does not declare is a TypeError at registration, not a silent extra.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from postrl.errors import ConfigError


@dataclass(frozen=True)
class NoFacts:
    """The facts of a registry whose entries carry none."""


F = TypeVar("F")


class Registry(Generic[F]):
    def __init__(self, kind: str, key: str = "", facts: Callable[..., F] = NoFacts):  # type: ignore[assignment]
        self.kind = kind
        """What an entry is, in words ("policy loss"): used in error messages."""
        self.key = key
        """The config key whose value names an entry, when there is one such key."""
        self._facts_type = facts
        """Builds an entry's facts from the keywords given at registration (a frozen dataclass)."""
        self._items: dict[str, Any] = {}
        self._facts: dict[str, F] = {}

    def register(self, name: str, **facts: Any) -> Callable[[Any], Any]:
        """Decorator: `@REG.register("name", fact=value, ...)`. A name registered twice is a
        programming error."""

        def deco(obj: Any) -> Any:
            self.add(name, obj, **facts)
            return obj

        return deco

    def add(self, name: str, obj: Any, **facts: Any) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._facts[name] = self._facts_type(**facts)  # an undeclared fact: TypeError, before the entry is in
        self._items[name] = obj

    def remove(self, name: str) -> None:
        """Forget `name` (an entry registered for one run, such as a reward model's term)."""
        self._items.pop(name, None)
        self._facts.pop(name, None)

    def get(self, name: str, key: str = "") -> Any:
        self.check(name, key)
        return self._items[name]

    def facts(self, name: str, key: str = "") -> F:
        """What was registered about entry `name` (ConfigError naming `key` if there is no such entry)."""
        self.check(name, key)
        return self._facts[name]

    def check(self, name: str, key: str = "") -> None:
        """Raise ConfigError naming the config key and the valid names if `name` is not registered."""
        if name not in self._items:
            raise ConfigError(self.unknown_message(name, key or self.key))

    def unknown_message(self, name: str, key: str) -> str:
        names = self.names()
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        if not key:
            where = f"{name!r}: "
        elif key.rsplit(".", 1)[-1] == name:  # the name is a mapping's key (`domains.NAME`): said once
            where = f"config key '{key}': "
        else:
            where = f"config key '{key}' = {name!r}: "
        return f"{where}unknown {self.kind}{hint} (expected one of: {listing(names) or 'none registered'})"

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(sorted(self._items.items()))

    def all_facts(self) -> Iterator[tuple[str, F]]:
        """(name, facts) of every entry, by name."""
        return iter(sorted(self._facts.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)


def listing(names: list[str], family_size: int = 4) -> str:
    """Names for a message, a family of `family_size` or more sharing a `prefix:` shown once:
    arith, code, rg:<name> (115 of them), sort."""
    families = Counter(n.split(":", 1)[0] for n in names if ":" in n)
    shown: dict[str, None] = {}
    for n in names:
        family = n.split(":", 1)[0] if ":" in n else ""
        big = bool(family) and families[family] >= family_size
        shown[f"{family}:<name> ({families[family]} of them)" if big else n] = None
    return ", ".join(shown)
