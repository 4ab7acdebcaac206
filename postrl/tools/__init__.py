"""Tools a model calls inside a multi-turn episode: the registry and call format (`base`), the
built-in `calculator` and `python` (`builtin`). Imports none of its submodules."""
