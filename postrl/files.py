"""Files replaced whole, never seen half-written: the run directory's state a resume reads back
(config.yaml, checkpoint pointers, tracker ids, the rows `postrl.train` writes for a run).

    with replacing(path) as f:      # a temporary sibling of path, open for writing
        f.write(text)               # on leaving: flushed, fsynced, os.replace'd onto path, directory fsynced
    write_atomic(path, text)        # the same for one string

A process killed at any point leaves either the old file (or none) or the new one; at worst a
stray `.NAME.tmpPID` beside it, which no reader looks at. Knows nothing of postrl but the crash
points its recovery tests use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from postrl.faults import crash_point


@contextmanager
def replacing(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        crash_point("atomic.write")  # written and fsynced, not yet renamed into place
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # the rename itself survives a power cut


def write_atomic(path: str | Path, text: str) -> None:
    with replacing(path) as f:
        f.write(text)


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
