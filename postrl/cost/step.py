"""One step's seconds phase by phase on given hardware, an eval's, and the evals of a run.

With P the decoder's matmul weights, V x d the vocabulary head, R = prompts x samples completions of
c tokens (at most C = max_new_tokens) after prompts of p tokens, at the FLOP/s and bytes/s the
hardware reaches:
  sampling   prefill 2 P p per distinct prompt; each of the C - 1 decode steps the larger of its
             FLOPs, 2 (P + Vd) per live row, and its bytes, every weight once plus the live rows'
             KV cache;
  reference  2 P per decoder token, 2 Vd per completion token through the head;
  update     per token 6 P with every weight trained (forward, input and weight gradients), 4 P with
             LoRA (frozen weights get no weight gradient) plus 6 per adapter weight, 2 P more with
             gradient checkpointing; the head's chunks are recomputed in the backward (8 Vd, LoRA 6 Vd);
  sync       2 x weight bytes / bandwidth, where the sampler holds its own copy of the weights;
  critic     (`critic.model`) its values' pass as the reference's and its steps as the update's, over
             its own model's P (a separate model's from its config), without the vocabulary head.
What the formulas leave out (Python, dispatch, the KV cache's bookkeeping; on a CPU also attention
and the vocabulary's work) is timed on a copy of the model 16 wide (`postrl.cost.host`), and added
to the device's time on a CPU, overlapped with it on a GPU. docs/hardware.md has the formulas and
their assumptions.

It knows the hardware only as rates (`postrl.cost.hardware.Hardware`): a preset, the CPU or custom
figures all go through the same formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from postrl.config.schema import Config, LoraConfig
from postrl.cost.hardware import Hardware
from postrl.cost.host import HostTimes
from postrl.cost.shape import ModelFacts, Workload, critic_lora, dtype_bytes


@dataclass(frozen=True)
class StepCost:
    prefill_s: float
    decode_s: float
    """The decode steps' arithmetic or memory time, whichever bounds each."""
    decode_bound: str
    """What bounds the last decode step: compute or memory."""
    host_s: float
    """Sampling's measured part (`HostTimes.decode_step` x steps): added on a CPU, overlapped on a GPU."""
    sampling_s: float
    reference_s: float
    update_s: float
    forward_s: float
    """One inference pass over the batch: what a pipelined run's proximal policy adds."""
    sync_s: float
    critic_s: float = 0.0
    """PPO's critic (`critic.model`): its values' pass in build_batch and its steps in the update; 0 without one."""

    @property
    def learning_s(self) -> float:
        return self.reference_s + self.update_s + self.critic_s

    @property
    def step_s(self) -> float:
        return self.sampling_s + self.sync_s + self.learning_s


def with_host(hw: Hardware, device_s: float, host_s: float) -> float:
    """A phase's seconds: a GPU runs while its host queues more work; on a CPU they take turns."""
    return max(device_s, host_s) if hw.accelerator else device_s + host_s


def sampling_seconds(model: ModelFacts, hw: Hardware, work: Workload, lora: LoraConfig, dtype: int,
                     host_per_step: float) -> tuple[float, float, str, float, float]:
    """(prefill, decode, decode bound, host, total) seconds of sampling `work`, in chunks of
    work.max_batch rows, for work.new_tokens steps (the longest row's) with the rows' mean
    share of them live. Attention's FLOPs and the vocabulary's bytes count on a GPU only: on a CPU
    the measured part holds them."""
    p, c, attention = work.prompt_tokens, work.new_tokens, float(hw.accelerator)
    live = work.completion_tokens / c  # rows still generating, on average: finished rows leave the batch
    adapters = 0 if model.fused(lora) else model.adapters(lora)  # fused: folded into the weights per call
    weights = (model.matmul + model.head + adapters) * dtype
    prefill = (work.prompts * (2 * model.matmul * p + attention * model.attention_flops(p, p / 2)) / hw.flops
               + work.prompts * 2 * model.head / hw.rate("head"))
    decode, bound, chunks = 0.0, "compute", math.ceil(work.rows / work.max_batch)
    for t in range(1, c):  # the first token comes from the prefill's logits, the last is never fed back
        for rows in [work.max_batch * live] * (chunks - 1) + [(work.rows - work.max_batch * (chunks - 1)) * live]:
            body = rows * (2 * (model.matmul + adapters) + attention * model.attention_flops(1, p + t))
            compute = body / hw.rate("decode") + rows * 2 * model.head / hw.rate("head")
            memory = (weights + rows * (model.kv_bytes(dtype) * (p + t) + attention * model.vocab_bytes)) / hw.bytes_per_s
            decode += max(compute, memory)
            bound = "compute" if compute >= memory else "memory"
    host = host_per_step * c * chunks
    return prefill, decode, bound, host, with_host(hw, prefill + decode, host)


@dataclass(frozen=True)
class PassFlops:
    """FLOPs of a learner pass over the step's batch: the decoder's and the vocabulary head's
    (whose chunks of a few dozen rows through V outputs run at their own rate on a CPU)."""

    body: float
    head: float

    def seconds(self, hw: Hardware) -> float:
        return self.body / hw.flops + self.head / hw.rate("head")


def learner_flops(cfg: Config, model: ModelFacts, work: Workload, attention: bool = True) -> tuple[PassFlops, PassFlops]:
    """(one forward pass, one epoch of the update) over the step's batch; `attention`: count
    attention's FLOPs (on a CPU the measured part holds it)."""
    lora = cfg.model.lora
    forward, update = _body_flops(model, work, lora, cfg.train.minibatches, cfg.model.gradient_checkpointing, attention)
    head = work.rows * work.completion_tokens
    per_head = 6 if lora.r > 0 else 8  # the head's chunks run forward twice: once more in the backward
    return PassFlops(forward, 2 * model.head * head), PassFlops(update, per_head * model.head * head)


def critic_flops(cfg: Config, critic: ModelFacts, work: Workload, attention: bool = True) -> tuple[PassFlops, PassFlops]:
    """(the values' pass, one epoch of the critic's steps) over the step's batch: the decoder's
    passes as the policy's, no vocabulary head (the value head's H -> 1, 1/V of it, left out) and
    no gradient checkpointing (the critic is built before the learner turns it on)."""
    forward, update = _body_flops(critic, work, critic_lora(cfg, cfg.model.lora), cfg.train.minibatches, False,
                                  attention)
    return PassFlops(forward, 0.0), PassFlops(update, 0.0)


def _body_flops(model: ModelFacts, work: Workload, lora: LoraConfig, minibatches: int, checkpointing: bool,
                attention: bool) -> tuple[float, float]:
    """The decoder's FLOPs of (a forward pass over the batch, an epoch of the update)."""
    fused = model.fused(lora)
    body, trained = work.body_tokens(fused), work.body_tokens(fused, minibatches)
    context = (work.prompt_tokens + work.new_tokens) / 2
    forward = 2 * model.matmul * body + attention * model.attention_flops(body, context)
    per_body = (4 if lora.r > 0 else 6) + (2 if checkpointing else 0)
    update = ((per_body * model.matmul + 6 * model.adapters(lora)) * trained
              + 3 * attention * model.attention_flops(trained, context))
    return forward, update


def extra_forwards(cfg: Config) -> int:
    """Inference passes a step adds: the proximal policy of stale batches (decoupled PPO), or the
    learner's log-probs under a rollout correction (an inference engine's numerics)."""
    from postrl.sampling.backends import SAMPLING_BACKENDS

    mode = cfg.rl.rollout_correction.mode
    learner_numerics = SAMPLING_BACKENDS.facts(cfg.rollout.backend).learner_numerics
    corrected = mode != "none" and not (mode == "auto" and learner_numerics)
    stale = cfg.pipeline.max_staleness > 0 and cfg.pipeline.proximal == "trainer"
    return int(corrected or stale)


def sync_bytes(cfg: Config, model: ModelFacts) -> float:
    """Weight bytes copied to the sampler once per step: none where postrl's engine samples with the
    learner's own tensors; the whole state otherwise (vLLM gets LoRA merged into the weights;
    sampler processes, Ray actors and the asynchronous thread's frozen copy get every tensor)."""
    shared = (cfg.rollout.backend == "postrl" and cfg.engine == "local" and cfg.pipeline.samplers == 0
              and cfg.pipeline.max_staleness == 0)
    return 0.0 if shared else (model.params + model.adapters(cfg.model.lora)) * dtype_bytes(cfg)


def optimiser_seconds(cfg: Config, trained: float, hw: Hardware) -> float:
    """AdamW's steps in an update (ppo_epochs x minibatches) over `trained` weights: each step reads
    weight, gradient and both moments and writes three, about 32 bytes a weight."""
    return cfg.train.ppo_epochs * cfg.train.minibatches * 32 * trained / hw.bytes_per_s


def critic_seconds(cfg: Config, critic: ModelFacts, work: Workload, hw: Hardware, host: HostTimes) -> float:
    """The critic's seconds in a step: one forward over the batch for its values, and per epoch
    and minibatch a forward and backward over the minibatch's rows and an AdamW step over the
    weights it trains (`ModelFacts.value_trained`), each with its measured host part."""
    forward, epoch = critic_flops(cfg, critic, work, attention=hw.accelerator)
    optimiser = optimiser_seconds(cfg, critic.value_trained(critic_lora(cfg, cfg.model.lora)), hw)
    return (with_host(hw, forward.seconds(hw), host.critic_values)
            + with_host(hw, cfg.train.ppo_epochs * epoch.seconds(hw), host.critic_steps) + optimiser)


def step_cost(cfg: Config, model: ModelFacts, work: Workload, hw: Hardware, host: HostTimes,
              critic: ModelFacts | None = None) -> StepCost:
    """Seconds of one step's phases on `hw` (formulas in the module docstring); `critic`: the
    critic's model (`postrl.cost.shape.critic_facts`), None without one."""
    dtype, lora = dtype_bytes(cfg), cfg.model.lora
    prefill, decode, bound, host_s, sampling = sampling_seconds(model, hw, work, lora, dtype, host.decode_step)
    forward, epoch = learner_flops(cfg, model, work, attention=hw.accelerator)
    vocab_s = work.rows * work.completion_tokens * model.vocab_bytes / hw.bytes_per_s if hw.accelerator else 0.0
    forward_s = with_host(hw, forward.seconds(hw) + vocab_s, host.reference)
    optimiser = optimiser_seconds(cfg, model.adapters(lora) if lora.r > 0 else model.params, hw)
    epochs = cfg.train.ppo_epochs * (epoch.seconds(hw) + 2 * vocab_s)
    update_s = with_host(hw, epochs, host.update) + optimiser + extra_forwards(cfg) * forward_s
    reference_s = forward_s if cfg.rl.kl_coef > 0 else host.reference
    return StepCost(
        prefill_s=prefill, decode_s=decode, decode_bound=bound, host_s=host_s, sampling_s=sampling,
        reference_s=reference_s, update_s=update_s,
        forward_s=forward_s, sync_s=2 * sync_bytes(cfg, model) / hw.bytes_per_s,
        critic_s=critic_seconds(cfg, critic, work, hw, host) if critic is not None else 0.0)


def eval_seconds(cfg: Config, model: ModelFacts, work: Workload, hw: Hardware, host_per_step: float) -> float:
    """One eval: per domain, a greedy reply and eval.samples_per_problem samples to each of
    eval.num_problems held-out problems, at the step's prompt length and max_new_tokens."""
    total = 0.0
    for samples in (1, cfg.eval.samples_per_problem):
        shape = Workload(cfg.eval.num_problems, samples, work.prompt_tokens, work.new_tokens, work.completion_tokens,
                         max_batch=work.max_batch)
        total += sampling_seconds(model, hw, shape, cfg.model.lora, dtype_bytes(cfg), host_per_step)[-1]
    return len(cfg.eval.domains or cfg.domains) * total


def evals_in_run(cfg: Config) -> int:
    """Evals a run makes: every eval.every_steps steps before the last, the final one, and at start."""
    every = cfg.eval.every_steps
    return ((cfg.train.total_steps - 1) // every if every else 0) + 1 + int(cfg.eval.at_start)
