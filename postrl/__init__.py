"""postrl: reinforcement-learning post-training of language models on verifiable tasks.

    import postrl
    run_dir = postrl.train("recipes/default.yaml", overrides=["train.total_steps=2"])
    postrl.evaluate(run_dir, recipe="recipes/default.yaml")

`train` and `evaluate` are `postrl.api`'s, loaded on first use: `import postrl` (and `postrl --help`)
stay light, without torch. They are looked up with importlib, not imported: this package's
`__init__` imports none of its modules (each of them runs it, see tests/test_architecture.py).
"""

import importlib

__version__ = "0.2.0"  # the one place the version is written: pyproject.toml reads it
__all__ = ["train", "evaluate"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("postrl.api"), name)
    raise AttributeError(f"module 'postrl' has no attribute {name!r}")
