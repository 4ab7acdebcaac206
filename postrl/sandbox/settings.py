"""The sandbox settings a recipe gives a code grader: declared once, here, and shared by the `code`
domain's params, a dataset domain's params and the `code` verifier's settings (each subclasses
`SandboxSettings`, so a recipe writes the keys flat: `domains.NAME.params.workers`).

    s = SandboxSettings(workers=2, allow_unisolated=True)
    s.pool_config("domains.mbpp.params.allow_unisolated")   # a local pool's SandboxConfig; None with sandbox_url

This module knows nothing of recipes: the caller passes the key its user writes `allow_unisolated`
under, which the pool's refusal names when isolation is unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from postrl.sandbox.runs import SandboxConfig

DEFAULT_TIMEOUT_S = 10.0
"""A program's test run (or a user reward call) is stopped after this long: the pool's own default
and `postrl sandbox serve`'s. Long enough for an io test of an APPS-style program under load on a
2-core machine; the built-in `code` domain, whose one-line programs finish in milliseconds, sets 3 s."""


@dataclass
class SandboxSettings:
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Deadline of one program's test run (a dataset domain: also of one user reward call), in seconds."""
    memory_mb: int = 512
    """Memory cap (address space) of one sandboxed program, in MiB."""
    workers: int = 0
    """Sandbox (or user-reward) worker processes; 0 = one per CPU core."""
    max_workers: int = 0
    """Elastic sandbox pool: grow toward this many workers while runs wait (0 = fixed size)."""
    idle_shrink_s: float = 30.0
    """Elastic sandbox pool: extra workers idle this long are stopped."""
    allow_unisolated: bool = False
    """Run without namespace isolation when bubblewrap is unavailable (rlimits/seccomp/uid only)."""
    sandbox_url: str = ""
    """A SandboxFusion-compatible server (e.g. `postrl sandbox serve`) instead of a local pool."""

    def pool_config(self, allow_unisolated_key: str) -> SandboxConfig | None:
        """The local pool these settings ask for; None when they name a sandbox server.
        `allow_unisolated_key` is where the user sets `allow_unisolated` (`domains.NAME.params.
        allow_unisolated`; empty: nowhere), which the pool's refusal names."""
        if self.sandbox_url:
            return None
        return SandboxConfig(workers=self.workers, memory_mb=self.memory_mb, allow_unisolated=self.allow_unisolated,
                             max_workers=self.max_workers, idle_shrink_s=self.idle_shrink_s,
                             allow_unisolated_key=allow_unisolated_key)


def sandbox_settings(obj: Any) -> SandboxSettings:
    """The sandbox settings part of `obj` (a params or settings object that subclasses them)."""
    return SandboxSettings(**{f.name: getattr(obj, f.name) for f in fields(SandboxSettings)})
