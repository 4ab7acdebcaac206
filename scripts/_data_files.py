"""The tail the data-making scripts share (make_code_problems.py, make_word_problems.py,
make_data_fixtures.py): their command line's `--out` and the JSONL files they write.

A file is one JSON object a line, UTF-8 with non-ASCII text kept as it is, written whole
(`postrl.files.write_atomic`: a temporary sibling, fsync, rename), so a stopped script never leaves
half a data file where a recipe reads it. The scripts are seeded, so running one again rewrites
the same bytes. A script imports this as `_data_files` (its directory is first on `sys.path`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from postrl.files import write_atomic


def parser(doc: str, out: str = "recipes/data") -> argparse.ArgumentParser:
    """The script's parser: `--help` prints its docstring's first line; `--out DIR` (default `out`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=out, help=f"the directory the files go to (default {out})")
    return ap


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """`rows` as JSON lines at `path` (its directory made), then `PATH: N problems` on stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{path}: {len(rows)} problems")
