"""Sampling backends: what turns prompt token ids into sampled completions, chosen by `rollout.backend`.

    backend = make_backend(RolloutConfig(backend="postrl"), model, tokenizer)
    gens = backend.generate(prompts, GenParams(max_new_tokens=8), generator)  # one Generation per prompt
    backend.load_weights(version)  # the model now holds policy version `version`: sample with it

A backend is token in, token out: prompt ids in; completion ids, per-token behaviour log-probs
(log softmax(logits / temperature) of each sampled token, before top-p truncation) and finish
reasons out, as `Generation` records. It knows no task, chat template, reward or `Sample`:
`Policy` encodes the prompts, splits them into batches by temperature and size, and builds the
samples; the engines publish weights.

Weights: a backend is built on the policy's model object. `load_weights(version)` tells it that
this model now holds the weights of policy version `version` (the learner updated it in place, or
an engine copied a published version into it); `Policy` calls it once per version, before the
first sampling call with that version, and again when an engine copies weights in or a restore
writes them under a version number already seen. A backend that samples from weights of its own
(an inference engine) copies the model's into them there, in one call. postrl's own backend
samples from the model object itself, which is shared with the learner (or is the engine's copy
that weights are loaded into), so it has nothing to copy: it only records the version.

A second backend is one new module and one entry here: a factory `(model, tokenizer, rollout
config) -> SamplingBackend` added to `SAMPLING_BACKENDS` (a factory whose library is heavy imports it inside
the call, so that choosing another backend never loads it). A user's module named in a recipe's
`imports:` may register one too; it then exists in sampler processes and Ray actors as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from postrl.config.schema import RolloutConfig
from postrl.errors import ConfigError
from postrl.registry import Registry
from postrl.sampling.continuous import generate_slots
from postrl.sampling.generate import Generation, GenParams, generate
from postrl.sampling.graphs import decode_graphs


@runtime_checkable
class SamplingBackend(Protocol):
    """Token in, token out, with weights synced once per policy version (see the module docstring)."""

    def generate(
        self,
        prompts: list[list[int]],
        params: GenParams | list[GenParams],
        generator: torch.Generator | None = None,
        on_done: Callable[[list[int], list[Generation]], None] | None = None,
    ) -> list[Generation]:
        """One completion per prompt, in prompt order. Draws come from `generator` only, so a
        seeded generator reproduces the same completions. `on_done(rows, generations)` is told
        about rows (indices into `prompts`) as they finish, each row once, while the rest go on.
        `params` is a list (one per prompt) only for a backend registered with `row_params`."""
        ...

    def load_weights(self, version: int) -> None:
        """The model this backend was built on now holds policy version `version`: sample with it."""
        ...


@dataclass(frozen=True)
class BackendFacts:
    """What a sampling backend registers beside its factory."""

    learner_numerics: bool = False
    """Its behaviour log-probs come from the learner's own forward (the same kernels on the same
    weights), so they equal the learner's recomputation to float rounding. False (an inference
    engine with kernels of its own): they differ by the train/inference mismatch, which
    `rl.rollout_correction: auto` corrects."""
    problem: Callable[[], str] | None = None
    """'' when the backend can run here, else why not in one line (its library missing, a version
    it is not tested with): `check_names` asks before a run directory is made or a model loaded."""
    row_params: bool = False
    """Its `generate` takes a list of `GenParams`, one per prompt, and samples them in one batch
    (greedy and sampled rows, other lengths and stop strings together). False: `Policy` calls it
    once per distinct `GenParams` instead."""
    continuous_batching: bool = False
    """Its `generate` takes a call of any size and decodes at most `rollout.max_num_seqs` rows of it at
    once, a finished row's slot going to the next (with `rollout.continuous_batching`). False: `Policy`
    cuts a call into chunks of that many rows."""
    model_problem: Callable[[Any], str] | None = None
    """'' when the backend can sample from this model, else why not in one line (an architecture or
    head size it has no kernel for): `check_model` asks once the model is loaded, before a run
    directory is made."""


SAMPLING_BACKENDS = Registry("sampling backend", key="rollout.backend", facts=BackendFacts)
"""name -> factory(model, tokenizer, rollout config) -> SamplingBackend; facts: `BackendFacts`."""


@SAMPLING_BACKENDS.register("postrl", learner_numerics=True, row_params=True, continuous_batching=True)
class PostrlBackend:
    """postrl's own batched engine (`postrl.sampling.generate`): the fused `FastLM` path where the
    model is Llama-family, else the model's own Hugging Face forward. It samples from the model
    object it was built on, so the sampled tokens' log-probs are the learner's to float rounding.
    With `rollout.continuous_batching`, a call decodes through `rollout.max_num_seqs` slots
    (`postrl.sampling.continuous`); with `rollout.cuda_graphs`, the decode step replays a CUDA graph
    (`postrl.sampling.graphs`; each call copies the model's current fused weights into the graphs'
    storage, so a new version needs nothing in `load_weights`)."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig):
        self.model, self.tok = model, tokenizer
        self.slots = cfg.max_num_seqs if cfg.continuous_batching else None
        """Slots of continuous batching; None: every row of a call decodes at once."""
        self.graphs = decode_graphs(cfg.cuda_graphs, model, cfg.max_num_seqs)
        """The decode step's CUDA graphs, by bucket, for the backend's life (`rollout.cuda_graphs`); None: eager."""
        self.version: int | None = None
        """The policy version last loaded: nothing else to do, the model object is the weights."""

    def generate(self, prompts: list[list[int]], params: GenParams | list[GenParams],
                 generator: torch.Generator | None = None,
                 on_done: Callable[[list[int], list[Generation]], None] | None = None) -> list[Generation]:
        if self.slots is not None:
            return generate_slots(self.model, prompts, params, self.tok.eos_token_id, self.tok.pad_token_id,
                                  generator=generator, decode=self._decode, on_done=on_done, slots=self.slots,
                                  graphs=self.graphs)
        return generate(self.model, prompts, params, self.tok.eos_token_id, self.tok.pad_token_id,
                        generator=generator, decode=self._decode, on_done=on_done, graphs=self.graphs)

    def load_weights(self, version: int) -> None:
        self.version = version

    def _decode(self, ids: list[int]) -> str:  # stop strings are matched on this text, as `Policy.decode`'s
        return self.tok.decode(ids, skip_special_tokens=True)


def vllm_problem() -> str:
    from postrl.sampling.vllm_backend import vllm_problem

    return vllm_problem()


def vllm_model_problem(model) -> str:
    from postrl.sampling.vllm_backend import vllm_model_problem

    return vllm_model_problem(model)


@SAMPLING_BACKENDS.register("vllm", learner_numerics=False, row_params=True, problem=vllm_problem,
                            model_problem=vllm_model_problem)
def vllm_backend(model, tokenizer, cfg: RolloutConfig) -> SamplingBackend:
    """vLLM's engine (`postrl.sampling.vllm_backend`), imported only when chosen."""
    from postrl.sampling.vllm_backend import VllmBackend

    return VllmBackend(model, tokenizer, cfg)


def backend_factory(name: str) -> Callable[[Any, Any, RolloutConfig], SamplingBackend]:
    """The registered factory of backend `name`; ConfigError naming `rollout.backend` if none."""
    return SAMPLING_BACKENDS.get(name)


def check_backend(name: str, key: str = "rollout.backend") -> None:
    """ConfigError naming `key` if backend `name` is not registered or cannot run here (`problem`)."""
    problem = SAMPLING_BACKENDS.facts(name, key=key).problem
    _refuse(name, key, problem() if problem is not None else "")


def check_model(cfg: RolloutConfig, model) -> None:
    """ConfigError naming `rollout.backend` if its backend cannot sample from `model` (`model_problem`)."""
    check = SAMPLING_BACKENDS.facts(cfg.backend, key="rollout.backend").model_problem
    _refuse(cfg.backend, "rollout.backend", check(model) if check is not None else "")


def _refuse(name: str, key: str, why: str) -> None:
    if why:
        raise ConfigError(f"config key '{key}' = {name!r}: {why}")


def make_backend(cfg: RolloutConfig, model, tokenizer) -> SamplingBackend:
    """Build backend `cfg.backend` on `model`: whether it can run here and sample from this model is
    asked first (also asked by `open_run`, before a run directory; here for engines built elsewhere:
    sampler processes, Ray actors, the Python API), what its factory returns is checked after."""
    name = cfg.backend
    check_backend(name)
    check_model(cfg, model)
    backend = backend_factory(name)(model, tokenizer, cfg)
    if not isinstance(backend, SamplingBackend):
        raise ConfigError(f"config key 'rollout.backend' = {name!r}: {type(backend).__name__} is not a sampling "
                          f"backend (it needs generate(prompts, params, generator, on_done) and load_weights(version))")
    return backend
