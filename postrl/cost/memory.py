"""Bytes one learner rank holds at its peak: weights, the reference copy, gradients, optimiser
state, float32 masters, activations, PPO's critic (its own of each) and the sampler's KV cache,
replicated or sharded N ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.config.schema import Config, LoraConfig
from postrl.cost.shape import ModelFacts, Workload, critic_lora, dtype_bytes, micro_rows
from postrl.model.logprobs import logits_chunk_mib

ACTIVATION_VALUES = (8, 4)
"""Values kept for the backward per token and layer: 8 x hidden (norms, q/k/v, attention output,
residuals) + 4 x intermediate (gate, up, their product, the down input)."""


@dataclass(frozen=True)
class Memory:
    """Bytes one learner rank holds at its peak."""

    weights: float
    reference: float
    """A frozen copy of the initial weights for the KL term (none with LoRA: the adapters are switched off)."""
    gradients: float
    moments: float
    """AdamW's two moments, float32."""
    masters: float
    """float32 master weights of bf16 training (`postrl.learner.precision`)."""
    activations: float
    """Kept for the backward over one micro-batch, plus the vocabulary head's logits chunks."""
    kv_cache: float
    """Sampling's KV cache, on the same device between updates."""
    critic: float = 0.0
    """PPO's critic (`critic.model`): its weights, value head included, AdamW's moments and bf16's
    float32 masters of the weights it trains; 0 without one."""
    critic_gradients: float = 0.0
    critic_activations: float = 0.0
    """Kept for the critic's backward over one micro-batch: no vocabulary head, no logits."""

    @property
    def total(self) -> float:
        """Weights and optimiser state stay; gradients and activations live during the update, the
        KV cache during sampling. The critic's gradients outlive its step into the policy's (it
        zeroes them at its next step); its activations and the policy's are never held at once."""
        steady = self.weights + self.reference + self.moments + self.masters + self.critic
        update = self.gradients + self.critic_gradients + max(self.activations, self.critic_activations)
        return steady + max(update, self.kv_cache)


def memory_per_rank(cfg: Config, model: ModelFacts, work: Workload, lora: LoraConfig, ranks: int = 1,
                    sharded: bool = False, accelerator: bool = True, critic: ModelFacts | None = None) -> Memory:
    """Memory of one of `ranks` learner ranks training with `lora` (r 0: every weight), with the
    parameters, gradients and optimiser state replicated on each rank or sharded N ways (FSDP), on
    an accelerator or the CPU (their default logits chunks differ); `critic`: the critic's model
    (`postrl.cost.shape.critic_facts`; a copy of the policy carries `lora`), None without one."""
    dtype = dtype_bytes(cfg)
    share = ranks if sharded else 1
    adapters = model.adapters(lora)
    trainable = adapters if lora.r > 0 else model.params
    width = work.prompt_tokens + work.new_tokens
    tokens = micro_rows(cfg, max(1, work.rows // cfg.train.minibatches // ranks), width) * width  # a rank's share
    chunk = logits_chunk_mib(cfg.model.logits_chunk_mib, torch.device("cuda" if accelerator else "cpu"))
    logits = 3 * chunk * 2**20  # a chunk of float32 logits, its softmax and its gradient
    critic_bytes = (_critic_bytes(critic, critic_lora(cfg, lora), tokens, dtype, share) if critic is not None
                    else (0.0, 0.0, 0.0))
    return Memory(
        weights=(model.params + adapters) * dtype / share,
        reference=model.params * dtype / share if lora.r <= 0 and cfg.rl.kl_coef > 0 else 0.0,
        gradients=trainable * dtype / share, moments=8 * trainable / share,
        masters=4 * trainable / share if dtype == 2 else 0.0,
        activations=_kept(model, tokens, dtype, cfg.model.gradient_checkpointing) + logits,
        kv_cache=work.rows * width * model.kv_bytes(dtype), critic=critic_bytes[0], critic_gradients=critic_bytes[1],
        critic_activations=critic_bytes[2])


def _kept(model: ModelFacts, tokens: float, dtype: int, checkpointing: bool) -> float:
    """Activation bytes kept for the backward over `tokens` tokens (ACTIVATION_VALUES)."""
    per_layer = ACTIVATION_VALUES[0] * model.hidden + ACTIVATION_VALUES[1] * model.intermediate
    if checkpointing:  # each layer's input kept; one layer's activations live at a time
        return tokens * (model.layers * model.hidden + per_layer) * dtype
    return tokens * model.layers * per_layer * dtype


def _critic_bytes(critic: ModelFacts, lora: LoraConfig, tokens: float, dtype: int,
                  share: int) -> tuple[float, float, float]:
    """(weights and optimiser state, gradients, activations) of a critic on `critic`'s model with
    `lora`, its state shared as the policy's: its own weights and a value head (hidden + 1), 2 + 8
    (+ 4 in bf16) bytes a trained weight (`ModelFacts.value_trained`); no gradient checkpointing
    (the critic is built before the learner turns it on), so every layer's activations are kept."""
    trained = critic.value_trained(lora)
    held = (critic.params + critic.adapters(lora) + critic.hidden + 1) * dtype + 8 * trained
    masters = 4 * trained if dtype == 2 else 0
    return (held + masters) / share, trained * dtype / share, _kept(critic, tokens, dtype, False)
