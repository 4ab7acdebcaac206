"""A second sampling backend for the tests (test_sampling_backends.py, test_processes.py): postrl's
own engine made always greedy, so its samples are recognisable (a group's completions are all
the same), which logs each `load_weights(version)` as "pid:backend-id version" to the file named
by $TOY_BACKEND_LOG. Named in a recipe's `imports:`, it exists in every process of a run, as a
user's backend would."""

import os
from dataclasses import replace

from postrl.sampling.backends import SAMPLING_BACKENDS, PostrlBackend

LOG = "TOY_BACKEND_LOG"


@SAMPLING_BACKENDS.register("toy_greedy")
class GreedyBackend:
    """Composition, not a subclass: a backend is anything with the Protocol's two methods."""

    def __init__(self, model, tokenizer, cfg):
        self.inner = PostrlBackend(model, tokenizer, cfg)
        self.prompts: list[list[int]] = []
        """Every prompt it was asked to complete, in order."""

    def generate(self, prompts, params, generator=None, on_done=None):
        self.prompts += prompts
        return self.inner.generate(prompts, replace(params, greedy=True), generator, on_done)

    def load_weights(self, version: int) -> None:
        self.inner.load_weights(version)
        if os.environ.get(LOG):
            with open(os.environ[LOG], "a") as f:
                f.write(f"{os.getpid()}:{id(self)} {version}\n")


def loads(path) -> list[tuple[str, int]]:
    """(the backend, as "pid:id", version) of each load_weights call logged to `path`."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(owner, int(version)) for owner, version in map(str.split, f)]
