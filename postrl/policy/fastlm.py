"""A lean functional forward for Llama-family decoders (Llama, Mistral, Qwen2, SmolLM2).

    lm = FastLM.wrap(model)            # None when the architecture is not covered
    kv = lm.new_cache(batch, max_len)  # preallocated [B, Hkv, max_len, D] per layer
    hidden = lm.hidden(ids, positions, bias, kv, start)

Why it exists: on a CPU with a small model, a Hugging Face forward spends most of its time in
Python (module calls, mask construction, cache bookkeeping), not in matmuls. This computes the
same function with a handful of tensor ops per layer: q/k/v and gate/up fused into one matmul
each, rotary tables built once, a static KV cache written in place, SDPA for attention.

It reads the model's own parameters (no copy of the live weights), so it always evaluates the
current policy and gradients flow into the Hugging Face model when called under autograd. The
math is the model's: RMSNorm, rotary embeddings from the model's own `rotary_emb` (so every
rope scaling variant it supports is honoured), SDPA attention, gated MLP; results agree with
the Hugging Face forward to float32 rounding (tests/test_rollout.py checks 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

COVERED = {"llama", "mistral", "qwen2"}


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    ln2: torch.Tensor
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None


class FastLM:
    def __init__(self, model):
        cfg = model.config
        self.model = model
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.act = ACT2FN[cfg.hidden_act]
        self.inter = cfg.intermediate_size
        self.dtype = model.model.embed_tokens.weight.dtype

    @classmethod
    def wrap(cls, model) -> FastLM | None:
        """A FastLM over `model`, or None when its architecture or settings are not covered."""
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in COVERED:
            return None
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
            return None
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            return None  # windowed attention would need a different mask
        if model.training and getattr(cfg, "attention_dropout", 0.0):
            return None  # dropout in attention is not reproduced here
        if getattr(cfg, "num_hidden_layers", 0) != len(inner.layers):
            return None
        return cls(model)

    def layers(self) -> list[_Layer]:
        """The weights, with q/k/v and gate/up fused (a differentiable concat of the parameters)."""
        out = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_b = None
            if a.q_proj.bias is not None:
                qkv_b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            gate_up_b = None
            if m.gate_proj.bias is not None:
                gate_up_b = torch.cat([m.gate_proj.bias, m.up_proj.bias])
            out.append(_Layer(
                layer.input_layernorm.weight,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), qkv_b,
                a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight,
                torch.cat([m.gate_proj.weight, m.up_proj.weight]), gate_up_b,
                m.down_proj.weight, m.down_proj.bias,
            ))
        return out

    def rotary(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [max_len, D] from the model's own rotary module."""
        pos = torch.arange(max_len)[None]
        probe = torch.zeros((), dtype=self.dtype)
        cos, sin = self.model.model.rotary_emb(probe, pos)
        return cos[0], sin[0]

    def new_cache(self, batch: int, max_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                for _ in self.model.model.layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)

    def hidden(self, ids, cos, sin, bias, layers, kv=None, start: int = 0, causal: bool = False):
        """Final-norm hidden states [B, S, H] for ids [B, S].

        cos, sin: [B, S, D] rotary rows at each token's position. bias: additive attention mask
        [B, 1, S, T] (0 or -inf) or None with `causal` for right-padded rows. kv: a cache from
        `new_cache`; the new keys/values are written at columns start..start+S and attention
        covers columns 0..start+S."""
        x = F.embedding(ids, self.model.model.embed_tokens.weight)
        b, s, _ = x.shape
        h, hk, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = cos[:, :, None], sin[:, :, None]  # broadcast over heads
        for i, w in enumerate(layers):
            y = F.rms_norm(x, (x.shape[-1],), w.ln1, self.eps)
            qkv = F.linear(y, w.qkv_w, w.qkv_b).view(b, s, h + 2 * hk, d)
            qk, v = qkv[:, :, : h + hk], qkv[:, :, h + hk :]
            half = d // 2
            rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rot * sin  # rotary on queries and keys in one pass
            q = qk[:, :, :h].transpose(1, 2)
            k, v = qk[:, :, h:].transpose(1, 2), v.transpose(1, 2)
            if kv is not None:
                kc, vc = kv[i]
                kc[:, :, start : start + s] = k
                vc[:, :, start : start + s] = v
                k, v = kc[:, :, : start + s], vc[:, :, : start + s]
            att = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, is_causal=causal and bias is None, enable_gqa=hk != h
            )
            x = x + F.linear(att.transpose(1, 2).reshape(b, s, h * d), w.o_w, w.o_b)
            y = F.rms_norm(x, (x.shape[-1],), w.ln2, self.eps)
            gate, up = F.linear(y, w.gate_up_w, w.gate_up_b).split(self.inter, dim=-1)
            x = x + F.linear(self.act(gate) * up, w.down_w, w.down_b)
        norm = self.model.model.norm
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def padding_bias(key_valid: torch.Tensor, queries: int, dtype) -> torch.Tensor:
    """Additive mask [B, 1, Q, T] for the last Q of T columns: causal, real keys only.

    Every position may also see itself, so a padding query never has an empty row (an empty
    row would give NaN, and NaN keys poison later steps even when masked)."""
    t = key_valid.shape[1]
    cols = torch.arange(t)
    rows = cols[t - queries :, None]
    allowed = (cols[None] <= rows) & key_valid[:, None, :].bool()  # [B, Q, T]
    allowed |= cols[None] == rows
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return bias[:, None]
