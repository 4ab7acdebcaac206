"""Print uv's arguments for the package sources pip is configured with on this machine.

`make setup` installs with `uv pip install` (a minute where pip takes three), but uv does not read
pip's configuration (pip.conf, PIP_* variables). This reads it through `pip config list` and says
the same to uv: --index-url, --extra-index-url, --find-links, --constraint, --no-index. Without
them a machine whose CPU torch build lies in a local wheel directory would resolve torch from PyPI
(a multi-GB CUDA build).

    uv pip install $(python scripts/pip_index_args.py) ...
"""

from __future__ import annotations

import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
SECTIONS = ("global", "install", ":env:")  # in pip's order of precedence, the last wins


def uv_args(listing: str) -> list[str]:
    """uv arguments for the output of `pip config list` (lines `section.key='value'`)."""
    values: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section not in SECTIONS or not value:
            continue
        rank = SECTIONS.index(section)
        if key not in values or values[key][0] <= rank:
            values[key] = (rank, shlex.split(value)[0] if value[0] in "'\"" else value)
    args = []
    for key, flag in FLAGS.items():
        for item in values.get(key, (0, ""))[1].split():
            args += [flag, item]
    if values.get("no-index", (0, ""))[1].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


def main() -> None:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    print(shlex.join(uv_args(listing)))


if __name__ == "__main__":
    main()
