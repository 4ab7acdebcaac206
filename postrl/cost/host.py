"""The part of a step the formulas leave out (Python, op dispatch, the KV cache's bookkeeping; on a
CPU also attention and the vocabulary's work), timed now on a narrow copy of the recipe's model
through postrl's own engine and learner.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from postrl.config.schema import Config
from postrl.cost.hardware import torch_threads
from postrl.cost.shape import ModelFacts, Workload

HOST_WIDTH = 16
"""Hidden and MLP width of the model copy that times the step's work that is not a weight matmul
(the hidden width rounded up to a multiple of the heads): its matmuls are ~1% of SmolLM2-135M's."""
HOST_DECODE_STEPS = 16
"""Decode steps the copy times (fewer when max_new_tokens is): the figure is per step."""


@dataclass(frozen=True)
class HostTimes:
    """Seconds of a step's work that the formulas leave out, measured now (`host_times`)."""

    decode_step: float
    """Per decode step of the step's sampling batch."""
    reference: float
    """The learner's batch building: the reference pass and the advantages."""
    update: float
    """The learner's update: every epoch and minibatch, forward, backward and optimiser."""


def host_times(cfg: Config, model: ModelFacts, work: Workload, tok, on_cpu: bool) -> HostTimes:
    """The step's work that is not in the formulas, timed now on a copy of the recipe's model whose
    hidden and MLP widths are HOST_WIDTH, with its layers and adapters: Python and op dispatch, the
    KV cache's bookkeeping. `on_cpu`: the copy keeps the attention heads and the vocabulary, and
    the time includes attention and each token's work over the vocabulary (the draw, the
    log-probs), whose small batched matmuls and single passes FLOPs and copy bandwidth do not
    predict on a CPU. For a GPU, where they are device work (counted in FLOPs and bytes), the copy
    has two heads of 8 and a vocabulary of HOST_WIDTH x 4: what is left is the host's share."""
    from transformers import AutoModelForCausalLM

    from postrl.model.lora import apply_lora

    heads, kv_heads, head_dim = (model.heads, model.kv_heads, model.head_dim) if on_cpu else (2, 2, 8)
    narrow = type(model.config).from_dict({
        **model.config.to_dict(), "hidden_size": heads * math.ceil(HOST_WIDTH / heads),  # a multiple of the heads
        "intermediate_size": HOST_WIDTH, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "vocab_size": model.vocab if on_cpu else 4 * HOST_WIDTH})
    torch.manual_seed(0)
    net = apply_lora(AutoModelForCausalLM.from_config(narrow).to(getattr(torch, cfg.model.dtype)), cfg.model.lora).eval()
    # a GPU's host launches kernels from one thread; on a CPU the run's threads do the work
    with torch_threads(cfg.run.threads if on_cpu else 1):
        return HostTimes(_decode_step_s(net, work, tok), *_learner_s(net, cfg, work, tok))


def _decode_step_s(net, work: Workload, tok) -> float:
    """Seconds per decode step of the step's batch (its distinct prompts x samples, no row ending
    early, each decoded as it ends), over at most HOST_DECODE_STEPS steps."""
    from postrl.sampling.generate import GenParams, generate

    rng = random.Random(0)
    length = max(1, round(work.prompt_tokens))
    vocab = net.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(work.prompts)]
    rows = [p for p in prompts for _ in range(work.samples)]

    def decoded(_rows: list[int], gens: list) -> None:  # as Policy turns each finished row into a Sample
        for g in gens:
            tok.decode(g.token_ids, skip_special_tokens=True)

    def sample(new: int) -> None:
        with torch.no_grad():
            generate(net, rows, GenParams(new), eos_id=-1, pad_id=0, generator=torch.Generator().manual_seed(0),
                     on_done=decoded)

    steps = min(work.new_tokens, HOST_DECODE_STEPS)
    return _steady_s(lambda: sample(steps)) / steps


def _learner_s(net, cfg: Config, work: Workload, tok) -> tuple[float, float]:
    """(build_batch, update) seconds of postrl's own learner on the step's batch: rows of a
    group's prompt and a completion of its own, to max_new_tokens, rewards alternating."""
    from postrl.learner.learner import Learner
    from postrl.model.lora import make_reference
    from postrl.records import Sample, Score, Task
    from postrl.sampling.policy import Policy

    rng, vocab, length = random.Random(0), net.config.vocab_size, max(1, round(work.prompt_tokens))
    samples = []
    for group in range(work.prompts):
        task, prompt = Task("cost", str(group), "", ""), [rng.randrange(1, vocab) for _ in range(length)]
        samples += [Sample(task, group, prompt, [rng.randrange(1, vocab) for _ in range(work.new_tokens)],
                           [-1.0] * work.new_tokens, "", "length", 1.0, 0, score=Score(float(j % 2), bool(j % 2)))
                    for j in range(work.samples)]
    reference = make_reference(net) if cfg.rl.kl_coef > 0 else None
    learner = Learner(Policy(net, tok), reference, cfg.train, cfg.rl, model_cfg=cfg.model)
    kl, built = cfg.rl.kl_coef, []
    build_s = _steady_s(lambda: built.append(learner.build_batch(samples, kl)))
    return build_s, _steady_s(lambda: learner.update(built[-1], kl, torch.Generator().manual_seed(0)))


def _steady_s(fn: Callable[[], object], budget: float = 2.0) -> float:
    """Median seconds of `fn` after a first call (which pays for first-call imports and
    allocations, as a run's first step does), over 3 calls or as many as `budget` seconds allow."""
    fn()
    times, end = [], time.perf_counter() + budget
    while not times or (len(times) < 3 and time.perf_counter() < end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
