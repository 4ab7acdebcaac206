"""Name -> function registries for the algorithm's variants (as verl's core_algos does)."""

from __future__ import annotations

from collections.abc import Callable


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self.items: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def deco(fn: Callable) -> Callable:
            if name in self.items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self.items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> Callable:
        if name not in self.items:
            raise KeyError(f"unknown {self.kind} '{name}'; available: {', '.join(sorted(self.items))}")
        return self.items[name]

    def names(self) -> list[str]:
        return sorted(self.items)
