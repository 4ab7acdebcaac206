"""Reading JSONL inputs (pairs, labels, preferences) with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from postrl.errors import UserError


def read_jsonl(
    path: str | Path,
    required: dict[str, type | tuple[type, ...]],
    check: Callable[[dict], str | None] | None = None,
) -> list[dict]:
    """Every non-blank line as a dict; a line that is not a JSON object with the `required`
    fields of the given types, or for which `check` returns a message, raises
    UserError('FILE:LINE: ...')."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object")
            for key, kind in required.items():
                if key not in row:
                    raise UserError(f"{path}:{lineno}: missing field '{key}'")
                if not _has_type(row[key], kind):
                    raise UserError(f"{path}:{lineno}: field '{key}' has the wrong type")
            problem = check(row) if check is not None else None
            if problem:
                raise UserError(f"{path}:{lineno}: {problem}")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no records")
    return rows


def _has_type(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int to isinstance; a label field typed (bool, int) accepts both, an int one not true
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
