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
    """The learner's batch building: the reference pass and the advantages (the critic's values apart)."""
    update: float
    """The learner's update: every epoch and minibatch, forward, backward and optimiser (the critic's steps apart)."""
    critic_values: float = 0.0
    """The critic's values over the batch in the batch building; 0 without a critic."""
    critic_steps: float = 0.0
    """The critic's steps in the update, every epoch and minibatch; 0 without a critic."""


def host_times(cfg: Config, model: ModelFacts, work: Workload, tok, on_cpu: bool,
               critic: ModelFacts | None = None) -> HostTimes:
    """The step's work that is not in the formulas, timed now on a copy of the recipe's model whose
    hidden and MLP widths are HOST_WIDTH, with its layers and adapters: Python and op dispatch, the
    KV cache's bookkeeping. `on_cpu`: the copy keeps the attention heads and the vocabulary, and
    the time includes attention and each token's work over the vocabulary (the draw, the
    log-probs), whose small batched matmuls and single passes FLOPs and copy bandwidth do not
    predict on a CPU. For a GPU, where they are device work (counted in FLOPs and bytes), the copy
    has two heads of 8 and a vocabulary of HOST_WIDTH x 4: what is left is the host's share.
    `critic`: the critic's model (`postrl.cost.shape.critic_facts`), whose narrow copy (a copy of
    the policy's for `critic.model: policy`) the learner's critic is, its calls timed apart."""
    from postrl.model.lora import apply_lora

    vocab = model.vocab if on_cpu else 4 * HOST_WIDTH
    net = apply_lora(_narrow(model, cfg, on_cpu, vocab), cfg.model.lora).eval()
    separate = _narrow(critic, cfg, on_cpu, vocab) if critic is not None and cfg.critic.model != "policy" else None
    # a GPU's host launches kernels from one thread; on a CPU the run's threads do the work
    with torch_threads(cfg.run.threads if on_cpu else 1):
        decode_step = _decode_step_s(net, work, tok)
        (reference, values), (update, steps) = _learner_s(net, cfg, work, tok, separate)
    return HostTimes(decode_step, reference, update, values, steps)


def _narrow(model: ModelFacts, cfg: Config, on_cpu: bool, vocab: int):
    """`model` HOST_WIDTH wide in the recipe's dtype: on a CPU with its own attention heads, for a
    GPU two of 8 (`host_times`); a vocabulary of `vocab`."""
    from transformers import AutoModelForCausalLM

    heads, kv_heads, head_dim = (model.heads, model.kv_heads, model.head_dim) if on_cpu else (2, 2, 8)
    narrow = type(model.config).from_dict({
        **model.config.to_dict(), "hidden_size": heads * math.ceil(HOST_WIDTH / heads),  # a multiple of the heads
        "intermediate_size": HOST_WIDTH, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "vocab_size": vocab})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(narrow).to(getattr(torch, cfg.model.dtype))


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
    return _steady_s(lambda: sample(steps))[0] / steps


def _learner_s(net, cfg: Config, work: Workload, tok, separate) -> tuple[tuple[float, float], tuple[float, float]]:
    """((build_batch, the critic's share of it), (update, the critic's share)) seconds of postrl's
    own learner on the step's batch, each less its critic's share: rows of a group's prompt and a
    completion of its own, to max_new_tokens, rewards alternating. With `critic.model` the learner
    has its critic, built as the run builds it (before the learner: no gradient checkpointing):
    on a copy of `net`, or on `separate`."""
    from postrl.learner.critic import make_critic
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
    critic, clock = make_critic(cfg, net, tok, lambda _name: (separate, tok)), _Clock()
    if critic is not None:
        critic.values, critic.step = clock.wrap(critic.values), clock.wrap(critic.step)
        critic.updates = cfg.critic.warmup_steps  # a step after the warm-up: the policy trains too
    reference = make_reference(net) if cfg.rl.kl_coef > 0 else None
    learner = Learner(Policy(net, tok), reference, cfg.train, cfg.rl, model_cfg=cfg.model, critic=critic)
    kl, built = cfg.rl.kl_coef, []
    build = _steady_s(lambda: built.append(learner.build_batch(samples, kl)), clock)
    return build, _steady_s(lambda: learner.update(built[-1], kl, torch.Generator().manual_seed(0)), clock)


class _Clock:
    """Seconds spent inside the calls it wraps."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


def _steady_s(fn: Callable[[], object], inner: _Clock | None = None, budget: float = 2.0) -> tuple[float, float]:
    """(median seconds of `fn` less those inside `inner`'s calls, the median of those) after a
    first call (which pays for first-call imports and allocations, as a run's first step does),
    over 3 calls or as many as `budget` seconds allow."""
    inner = inner if inner is not None else _Clock()
    fn()
    outer, within, end = [], [], time.perf_counter() + budget
    while not outer or (len(outer) < 3 and time.perf_counter() < end):
        before, t0 = inner.seconds, time.perf_counter()
        fn()
        took, spent = time.perf_counter() - t0, inner.seconds - before
        outer.append(took - spent)
        within.append(spent)
    return statistics.median(outer), statistics.median(within)
