"""Bytes one learner rank holds at its peak: weights, the reference copy, gradients, optimiser
state, float32 masters, activations and the sampler's KV cache, replicated or sharded N ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.config.schema import Config, LoraConfig
from postrl.cost.shape import ModelFacts, Workload, dtype_bytes, micro_rows
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

    @property
    def total(self) -> float:
        """Weights and optimiser state stay; gradients and activations live during the update, the
        KV cache during sampling."""
        steady = self.weights + self.reference + self.moments + self.masters
        return steady + max(self.gradients + self.activations, self.kv_cache)


def memory_per_rank(cfg: Config, model: ModelFacts, work: Workload, lora: LoraConfig, ranks: int = 1,
                    sharded: bool = False, accelerator: bool = True) -> Memory:
    """Memory of one of `ranks` learner ranks training with `lora` (r 0: every weight), with the
    parameters, gradients and optimiser state replicated on each rank or sharded N ways (FSDP), on
    an accelerator or the CPU (their default logits chunks differ)."""
    dtype = dtype_bytes(cfg)
    share = ranks if sharded else 1
    adapters = model.adapters(lora)
    trainable = adapters if lora.r > 0 else model.params
    width = work.prompt_tokens + work.new_tokens
    tokens = micro_rows(cfg, max(1, work.rows // cfg.train.minibatches // ranks), width) * width  # a rank's share
    per_layer = ACTIVATION_VALUES[0] * model.hidden + ACTIVATION_VALUES[1] * model.intermediate
    if cfg.model.gradient_checkpointing:  # each layer's input kept; one layer's activations live at a time
        kept = tokens * (model.layers * model.hidden + per_layer) * dtype
    else:
        kept = tokens * model.layers * per_layer * dtype
    chunk = logits_chunk_mib(cfg.model.logits_chunk_mib, torch.device("cuda" if accelerator else "cpu"))
    logits = 3 * chunk * 2**20  # a chunk of float32 logits, its softmax and its gradient
    return Memory(
        weights=(model.params + adapters) * dtype / share,
        reference=model.params * dtype / share if lora.r <= 0 and cfg.rl.kl_coef > 0 else 0.0,
        gradients=trainable * dtype / share, moments=8 * trainable / share,
        masters=4 * trainable / share if dtype == 2 else 0.0, activations=kept + logits,
        kv_cache=work.rows * width * model.kv_bytes(dtype))
