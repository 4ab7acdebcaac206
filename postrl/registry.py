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
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from postrl.errors import ConfigError


class Registry:
    def __init__(self, kind: str, key: str = ""):
        self.kind = kind
        """What an entry is, in words ("policy loss"): used in error messages."""
        self.key = key
        """The config key whose value names an entry, when there is one such key."""
        self._items: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: `@REG.register("name")`. A name registered twice is a programming error."""

        def deco(obj: Any) -> Any:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: Any) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._items[name] = obj

    def remove(self, name: str) -> None:
        """Forget `name` (an entry registered for one run, such as a reward model's term)."""
        self._items.pop(name, None)

    def get(self, name: str, key: str = "") -> Any:
        self.check(name, key)
        return self._items[name]

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
