"""A sampling backend whose weight sync never lands, for the mismatch tests
(test_rollout_correction.py): it samples with postrl's own engine from a frozen copy of the model
made when it is built, and its `load_weights` does nothing. Registered as an inference engine
(`learner_numerics=False`), so `rl.rollout_correction.mode: auto` resolves to seq_mask with it.
Named in a recipe's `imports:` it exists in every process of a run, as a user's backend would."""

import copy

from postrl.sampling.backends import SAMPLING_BACKENDS, PostrlBackend


@SAMPLING_BACKENDS.register("frozen", learner_numerics=False)
class FrozenBackend:
    def __init__(self, model, tokenizer, cfg):
        self.inner = PostrlBackend(copy.deepcopy(model), tokenizer, cfg)

    def generate(self, prompts, params, generator=None, on_done=None):
        return self.inner.generate(prompts, params, generator, on_done)

    def load_weights(self, version: int) -> None:
        """The broken sync: the learner's new weights never reach the copy."""
