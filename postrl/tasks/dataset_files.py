"""Reading a data set's rows from a local file or directory, each with where it came from.

    for where, row in read_rows("data/gsm.jsonl"):    # ("data/gsm.jsonl:7", {"question": ..., ...})

Formats, by the path:

    .jsonl           one JSON object per line (blank lines skipped)
    .json            a JSON array of objects, or JSON lines
    .parquet         read with pyarrow
    .csv             read with the csv module: every value a string, as written
    a directory      written by `datasets.Dataset.save_to_disk` (read with `datasets.load_from_disk`;
                     a DatasetDict gives its only split, else its "train" split)

`where` is `FILE:LINE` for text formats (the line the row starts on) and `FILE:ROW` (1-based)
for Parquet and Arrow. A row that is not an object is yielded as a `BadRow` so that the caller
decides, as for a row with a missing column, whether it stops the run or is skipped. Values are
made JSON-safe (dates and bytes become strings) because every row travels with its task into the
rollout store. Nothing is ever downloaded: only local paths are read.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.errors import UserError

FORMATS = (".jsonl", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class BadRow:
    """A record that is not a JSON object (or not JSON at all)."""

    problem: str


def read_rows(path: str | Path) -> Iterator[tuple[str, dict[str, Any] | BadRow]]:
    """(where, row or BadRow) for every record of the file or `save_to_disk` directory at `path`."""
    p = Path(path)
    if p.is_dir():
        yield from _read_arrow_dir(p)
        return
    if not p.is_file():
        raise UserError(f"{p}: no such file or directory")
    suffix = p.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".csv": _read_csv}
    if suffix not in readers:
        raise UserError(f"{p}: unknown data format {suffix or '(no suffix)'}; expected {', '.join(FORMATS)} "
                        "or a directory from datasets' save_to_disk")
    yield from readers[suffix](p)


def json_safe(row: dict[str, Any]) -> dict[str, Any]:
    """The row with every value a JSON value (others as their str)."""
    return json.loads(json.dumps(row, default=str))


def _object(where: str, value: Any) -> tuple[str, dict[str, Any] | BadRow]:
    if not isinstance(value, dict):
        return where, BadRow(f"expected a JSON object, got {type(value).__name__}")
    return where, value


def _read_jsonl(p: Path) -> Iterator[tuple[str, dict | BadRow]]:
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{p}:{lineno}", BadRow(f"not valid JSON ({e.msg})")
                continue
            yield _object(f"{p}:{lineno}", value)


def _read_json(p: Path) -> Iterator[tuple[str, dict | BadRow]]:
    text = p.read_text(encoding="utf-8")
    start = len(text) - len(text.lstrip())
    if not text[start:].startswith("["):
        yield from _read_jsonl(p)
        return
    # The array's items one at a time, so that each row knows the line it starts on.
    decoder, pos = json.JSONDecoder(), start + 1
    while True:
        pos = _skip(text, pos, ",")
        if pos >= len(text):
            raise UserError(f"{p}: the JSON array is not closed")
        if text[pos] == "]":
            return
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}:{line}: not valid JSON ({e.msg})") from None
        yield _object(f"{p}:{line}", value)


def _skip(text: str, pos: int, separators: str) -> int:
    """The position of the next character that is neither whitespace nor one of `separators`."""
    while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
        pos += 1
    return pos


def _read_parquet(p: Path) -> Iterator[tuple[str, dict | BadRow]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors vary by version; any is "cannot read"
        raise UserError(f"{p}: cannot read as Parquet ({type(e).__name__}: {str(e)[:120]})") from None
    for i, row in enumerate(table.to_pylist(), 1):
        yield f"{p}:{i}", json_safe(row)


def _read_csv(p: Path) -> Iterator[tuple[str, dict | BadRow]]:
    with p.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        start = 2  # the header is line 1
        for row in reader:
            where = f"{p}:{start}"
            start = reader.line_num + 1
            if None in row:  # more fields than the header names
                yield where, BadRow(f"{len(row) - 1 + len(row[None])} fields, the header has {len(row) - 1}")
                continue
            yield where, dict(row)


def _read_arrow_dir(p: Path) -> Iterator[tuple[str, dict | BadRow]]:
    try:
        import datasets
    except ImportError:
        raise UserError(f"{p}: reading a save_to_disk directory needs the 'datasets' package") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except FileNotFoundError as e:
        raise UserError(f"{p}: not a directory written by save_to_disk ({str(e)[:120]})") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if len(splits) != 1 and "train" not in splits:
            raise UserError(f"{p}: a DatasetDict with splits {', '.join(splits)}; point at one split's directory")
        ds = ds[splits[0] if len(splits) == 1 else "train"]
    for i, row in enumerate(ds.to_list(), 1):
        yield f"{p}:{i}", json_safe(row)
