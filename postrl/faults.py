"""Named crash points for recovery tests.

    POSTRL_CRASH_AT=checkpoint.write:2 postrl train ...

kills the process with SIGKILL (no cleanup, no flushing: like a power cut) the 2nd time the
point `checkpoint.write` is reached. Unset, a crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_hits: Counter[str] = Counter()


def crash_point(name: str) -> None:
    spec = os.environ.get("POSTRL_CRASH_AT")
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    _hits[name] += 1
    if _hits[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
