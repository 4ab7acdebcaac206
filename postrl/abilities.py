"""Optional abilities of domains and verifiers, each a small runtime-checkable Protocol.

A domain must be a `postrl.tasks.base.Domain` (sample, heldout, score); a verifier a
`postrl.rewards.verifiers.Verifier`. Beyond that, each may have some of these:

    if isinstance(domain, Stateful):       # its state goes into every checkpoint
        state["domains"][name] = domain.state_dict()

`check_abilities(obj, what)` runs once where a domain or verifier is built (`tasks.catalog.
make_domain`, `rewards.verifiers.make_verifier`): an ability half implemented (`load_state_dict`
without `state_dict`) or a method one letter off an ability's (`state_dic`) is a one-line error
there, instead of an ability silently skipped at every use. This module knows no domain and no
verifier: it is a leaf.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Protocol, runtime_checkable

from postrl.errors import UserError


@runtime_checkable
class Stateful(Protocol):
    """State that a checkpoint keeps and a resume restores (a dataset domain's epoch order)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """Holds processes or pools (a sandbox, reward workers) that `close` stops at the end of a run."""

    def close(self) -> None: ...


@runtime_checkable
class Finite(Protocol):
    """A finite set of training rows, drawn in epochs (`train.epochs` counts them)."""

    train_size: int


@runtime_checkable
class RunsCode(Protocol):
    """Runs programs in a sandbox pool that the Ray engine may host as its own actors instead."""

    def sandbox_config(self) -> Any:
        """The local pool's `postrl.sandbox.runs.SandboxConfig`; None when it uses a sandbox server."""

    def use_sandbox(self, backend: Any) -> None: ...


@runtime_checkable
class ReadsRows(Protocol):
    """Makes its tasks from data rows, so `postrl score` and `reward-check` can grade a file's rows."""

    def task_of_row(self, row: dict, where: str = "") -> Any: ...


@runtime_checkable
class Resettable(Protocol):
    """An environment: opens a multi-turn episode per task (`postrl.tasks.env`)."""

    def reset(self, task: Any) -> Any: ...


@runtime_checkable
class ScoresEpisodes(Protocol):
    """Grades finished episodes, with the environment's own verdict where it gave one."""

    def score_episodes(self, tasks: list, responses: list, episodes: list) -> list: ...


@runtime_checkable
class DeclaresComponents(Protocol):
    """Names the components its scores may carry (the reward terms a recipe may weight)."""

    reward_components: tuple[str, ...]


@runtime_checkable
class WithGold(Protocol):
    """Has a monitoring-only gold scorer (`domains.NAME.gold`, set by `tasks.catalog.build_domains`)."""

    gold: Any


@runtime_checkable
class HasVerifier(Protocol):
    """Grades with a verifier of its own (a dataset domain): its extractor is `verifier.extract_spec`."""

    verifier: Any


ABILITIES: tuple[type, ...] = (Stateful, Closeable, Finite, RunsCode, ReadsRows, Resettable, ScoresEpisodes,
                               DeclaresComponents, WithGold, HasVerifier)
"""The abilities of a domain or verifier, which `check_abilities` checks where one is built."""


# -- abilities of an episode (made per rollout by an environment's `reset`, so checked at each use)


@runtime_checkable
class Judged(Protocol):
    """An episode that gives its own verdict with its reward (code_retry's, a tool episode's)."""

    correct: bool | None
    components: dict[str, float]


@runtime_checkable
class OffersTools(Protocol):
    """An episode with tools, for a chat template that renders tools itself (`postrl.tasks.env`)."""

    tool_schemas: list[dict]
    template_messages: list[dict]


def members(protocol: type) -> set[str]:
    """The names a Protocol of this module asks for."""
    return {n for n in (*vars(protocol), *getattr(protocol, "__annotations__", {}))
            if not n.startswith("_")}


def check_abilities(obj: Any, what: str) -> None:
    """UserError naming `what` when `obj` has part of an ability's methods but not all, or a method
    whose name is one slip away from an ability's (which every use would silently skip)."""
    names = {n for n in dir(obj) if not n.startswith("_")}
    every = set().union(*(members(p) for p in ABILITIES))
    for protocol in ABILITIES:
        wanted = members(protocol)
        if names & wanted and not wanted <= names:
            raise UserError(f"{what} has {', '.join(sorted(names & wanted))} but not "
                            f"{', '.join(sorted(wanted - names))}: postrl.abilities.{protocol.__name__} needs both")
    for name in sorted(names - every):
        if not callable(inspect.getattr_static(obj, name, None)):
            continue
        close = difflib.get_close_matches(name, sorted(every), n=1, cutoff=0.85)
        if close:
            raise UserError(f"{what} defines {name}(): did you mean {close[0]}()? "
                            f"(an optional ability, see postrl.abilities)")
