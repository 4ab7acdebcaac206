"""A lean functional forward for Llama-family decoders (Llama, Mistral, Qwen2, SmolLM2).

    lm = FastLM.wrap(model)            # None when the architecture is not covered
    kv = lm.new_cache(batch, max_len)  # preallocated [B, Hkv, max_len, D] per layer
    hidden = lm.hidden(ids, positions, bias, kv, start)

Why it exists: on a CPU with a small model, a Hugging Face forward spends most of its time in
Python (module calls, mask construction, cache bookkeeping), not in matmuls. This computes the
same function with a handful of tensor ops per layer: q/k/v and gate/up fused into one matmul
each, rotary tables built once, a static KV cache written in place, SDPA for attention.

It reads the model's own parameters (no copy of the live weights), so it always evaluates the
current policy and gradients flow into the Hugging Face model when called under autograd. A
peft LoRA model is covered too (plain LoRA on any of the seven projections, its active adapters,
no dropout while training): under autograd each adapted projection adds its low-rank term
(x A^T) B^T * alpha/r beside the frozen weight, as peft does, so the update back-propagates
through the small factors only; without autograd (sampling, the reference and eval passes) the
factors are folded into the weights once per call (W + B A * alpha/r), and decoding then costs
what the base model's does. `FastLM.wrap(model, adapters=False)` runs the base weights alone: the
LoRA reference policy. The
math is the model's: RMSNorm, rotary embeddings from the model's own `rotary_emb` (so every
rope scaling variant it supports is honoured), SDPA attention, gated MLP; results agree with
the Hugging Face forward to float32 rounding (tests/test_rollout.py checks 1e-5).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass

import torch
import torch.nn.functional as F

COVERED = {"llama", "mistral", "qwen2"}


Factors = tuple[torch.Tensor, torch.Tensor]
"""A projection's low-rank term as (A [R, in], B [out, R]): x -> (x A^T) B^T, the LoRA scale in B."""


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
    qkv_lora: Factors | None = None
    o_lora: Factors | None = None
    gate_up_lora: Factors | None = None
    down_lora: Factors | None = None


class FastLM:
    def __init__(self, model, adapters: bool = True):
        cfg = model.config
        self.model = hf_model(model)
        """The Hugging Face causal LM (under a peft wrapper, its base model, whose projections hold the adapters)."""
        self.adapters = adapters
        """Whether LoRA adapters count (False: the base weights alone, the LoRA reference)."""
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.act = _activation(cfg.hidden_act)
        self.dtype = self.model.model.embed_tokens.weight.dtype
        self.device = self.model.model.embed_tokens.weight.device
        """Where every tensor this forward makes is created: the model's own device."""

    @classmethod
    def wrap(cls, model, adapters: bool = True) -> FastLM | None:
        """A FastLM over `model` (a peft LoRA model included), or None when its architecture or
        settings are not covered. `adapters=False`: the base weights alone. A wrapper that is not
        a model itself (the LoRA reference) says what it runs through its own `fast_lm()`."""
        own = getattr(model, "fast_lm", None)
        if callable(own):
            return own()
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in COVERED:
            return None
        base = hf_model(model)
        inner = getattr(base, "model", None)
        if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(base, "lm_head"):
            return None
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            return None  # windowed attention would need a different mask
        if base.training and getattr(cfg, "attention_dropout", 0.0):
            return None  # dropout in attention is not reproduced here
        if getattr(cfg, "num_hidden_layers", 0) != len(inner.layers) or not _covered_linears(base):
            return None
        return cls(model, adapters)

    def layers(self) -> list[_Layer]:
        """The weights, with q/k/v and gate/up fused (a differentiable concat of the parameters).
        LoRA adapters: their low-rank factors beside each weight under autograd, else folded in."""
        fold = not torch.is_grad_enabled()
        out = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv, qkv_lora = self._fused([a.q_proj, a.k_proj, a.v_proj], fold)
            o, o_lora = self._fused([a.o_proj], fold)
            gate_up, gate_up_lora = self._fused([m.gate_proj, m.up_proj], fold)
            down, down_lora = self._fused([m.down_proj], fold)
            out.append(_Layer(
                layer.input_layernorm.weight, qkv, _bias([a.q_proj, a.k_proj, a.v_proj]),
                o, _bias([a.o_proj]),
                layer.post_attention_layernorm.weight, gate_up, _bias([m.gate_proj, m.up_proj]),
                down, _bias([m.down_proj]),
                qkv_lora, o_lora, gate_up_lora, down_lora,
            ))
        return out

    def _fused(self, projections: list, fold: bool) -> tuple[torch.Tensor, Factors | None]:
        """The projections' weights stacked, and their LoRA term: (A [R, in], B [out, R]) with each
        projection's factors on its own block of B's rows (zero elsewhere), or folded into the
        weight (`fold`), or None without adapters."""
        weights = [_linear(p).weight for p in projections]
        factors = [_lora_factors(p) if self.adapters else None for p in projections]
        if all(f is None for f in factors):
            return _cat(weights), None
        if fold:
            return _cat([w if f is None else w + f[1] @ f[0] for w, f in zip(weights, factors)]), None
        a = [f[0] if f is not None else w.new_zeros((0, w.shape[1])) for w, f in zip(weights, factors)]
        b = [f[1] if f is not None else w.new_zeros((w.shape[0], 0)) for w, f in zip(weights, factors)]
        return _cat(weights), (_cat(a), torch.block_diag(*b))

    def rotary(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [max_len, D] from the model's own rotary module."""
        pos = torch.arange(max_len, device=self.device)[None]
        probe = torch.zeros((), dtype=self.dtype, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, pos)
        return cos[0], sin[0]

    def new_cache(self, batch: int, max_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device))
                for _ in self.model.model.layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.lm_head
        return F.linear(hidden, head.weight, head.bias)

    def hidden(self, ids, cos, sin, bias, layers, kv=None, start: int = 0, causal: bool = False, share=None,
               segments: list[int] | None = None, compiled: str | None = None):
        """Final-norm hidden states for ids [B, S]: [B, S, H], or [N, H] with `share`.

        cos, sin: [B, S, D] rotary rows at each token's position. bias: additive attention mask
        [B, 1, S, T] (0 or -inf) or None with `causal` for right-padded rows. kv: a cache from
        `new_cache`; the new keys/values are written at columns start..start+S and attention
        covers columns 0..start+S. share: a `Shared` from `shared_prefixes`; norms, projections
        and the MLP (nearly all the FLOPs) then run once per distinct prefix, and only
        attention sees the tokens in their [B, S] places. segments: packed sequences (ids [1, S]
        holding several sequences back to back, of these lengths): attention is causal within
        each one and never crosses into another. compiled: a torch.compile backend ("inductor" with
        `train.compile`) for each layer's parts around attention (`compiled_blocks`); None: eager."""
        b, s = ids.shape
        if share is not None:
            ids, cos, sin = ids.flatten()[share.owner], cos.flatten(0, 1)[share.owner], sin.flatten(0, 1)[share.owner]
        embed = self.model.model.embed_tokens
        # padding_idx as the module has it: that row receives no gradient through the input side
        x = F.embedding(ids, embed.weight, padding_idx=embed.padding_idx)  # [B, S, H] or [N, H]
        cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over heads
        h, hk, d = self.heads, self.kv_heads, self.head_dim
        before, after = compiled_blocks(compiled) if compiled else (_before_attention, _after_attention)
        for i, w in enumerate(layers):
            qk, v = before(x, w.ln1, self.eps, w.qkv_w, w.qkv_b, w.qkv_lora, cos, sin, h, hk)
            qk = _spread(qk, share, b, s)
            q, k, v = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), _spread(v, share, b, s).transpose(1, 2)
            if kv is not None:
                kc, vc = kv[i]
                kc[:, :, start : start + s] = k
                vc[:, :, start : start + s] = v
                k, v = kc[:, :, : start + s], vc[:, :, : start + s]
            if segments is not None:
                att = _segment_attention(q, k, v, segments, hk != h).transpose(1, 2)
            elif s == 1:
                att = _one_query_attention(q, k, v, bias).transpose(1, 2)
            else:
                att = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, is_causal=causal and bias is None, enable_gqa=hk != h
                ).transpose(1, 2)  # [B, S, heads, D]
            att = att.reshape(b, s, h * d) if share is None else att.reshape(b * s, h * d)[share.owner]
            x = after(x, att, w.o_w, w.o_b, w.o_lora, w.ln2, self.eps, w.gate_up_w, w.gate_up_b, w.gate_up_lora,
                      w.down_w, w.down_b, w.down_lora, self.act)
        return F.rms_norm(x, (x.shape[-1],), self.model.model.norm.weight, self.eps)


def _before_attention(x, ln1, eps: float, qkv_w, qkv_b, qkv_lora, cos, sin, h: int, hk: int):
    """A layer up to attention: x [..., H] -> rotated queries and keys [..., h + hk, D], values [..., hk, D]."""
    d = cos.shape[-1]
    y = F.rms_norm(x, (x.shape[-1],), ln1, eps)
    qkv = _project(y, qkv_w, qkv_b, qkv_lora).unflatten(-1, (h + 2 * hk, d))
    qk, v = qkv[..., : h + hk, :], qkv[..., h + hk :, :]
    rot = torch.cat((-qk[..., d // 2 :], qk[..., : d // 2]), dim=-1)
    return qk * cos + rot * sin, v  # rotary on queries and keys in one pass


def _after_attention(x, att, o_w, o_b, o_lora, ln2, eps: float, gate_up_w, gate_up_b, gate_up_lora,
                     down_w, down_b, down_lora, act):
    """A layer from attention's output att [..., h * D] on: x [..., H] with the attention and MLP residuals added."""
    x = x + _project(att, o_w, o_b, o_lora)
    y = F.rms_norm(x, (x.shape[-1],), ln2, eps)
    gate, up = _project(y, gate_up_w, gate_up_b, gate_up_lora).split(down_w.shape[1], dim=-1)
    return x + _project(act(gate) * up, down_w, down_b, down_lora)


@functools.cache
def compiled_blocks(backend: str):
    """`_before_attention` and `_after_attention` through torch.compile's `backend` (`train.compile`:
    inductor; the GPU script's --smoke: eager, dynamo's capture alone): a decoder layer's norms,
    projections, rotary, activation and residuals, whose elementwise ops inductor fuses (between
    the matmuls eager mode launches one kernel each). Attention stays outside: it is SDPA's fused
    kernel already, and its inputs vary in form (shared prefixes, packed segments, a cache written
    in place), which would break the graph. Compiled once a process, lazily, with dynamic shapes
    (every micro-batch has its own token count); the weights are arguments, so every layer and
    every model of an architecture reuses one graph (LoRA's factors, or their absence, another)."""
    return (torch.compile(_before_attention, backend=backend, dynamic=True),
            torch.compile(_after_attention, backend=backend, dynamic=True))


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile's default backend (inductor) cannot compile on `device` here, or None:
    on the CPU it needs a C++ compiler, on CUDA Triton."""
    if device.type == "cpu":
        from torch._inductor import config

        names = [config.cpp.cxx[1]] if config.cpp.cxx[1] else ["g++", "clang++", "c++"]
        if not any(shutil.which(n) for n in names):
            return f"inductor needs a C++ compiler on the CPU and finds none ({', '.join(names)} on PATH)"
        return None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "inductor needs Triton on CUDA and it is not installed"
    return None


@functools.cache
def _activation(name: str):
    """transformers' activation module `name`, one instance a process: the compiled layers
    (`compiled_blocks`) then see the same object on every call, not a new one to recompile for."""
    # here, not at the top: importing transformers.activations loads transformers' modelling stack
    # (about 1.5 s), which commands that only read the registries (`postrl plan`) never need
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, lora: Factors | None) -> torch.Tensor:
    out = F.linear(x, w, b)
    return out if lora is None else out + F.linear(F.linear(x, lora[0]), lora[1])


def hf_model(model):
    """The Hugging Face model under a peft wrapper (its projections hold the adapters), else `model`."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0] if len(ts) == 1 else torch.cat(ts)


def _bias(projections: list) -> torch.Tensor | None:
    biases = [_linear(p).bias for p in projections]
    return None if biases[0] is None else _cat(biases)


def _linear(module) -> torch.nn.Linear:
    """The nn.Linear holding a projection's own weight (a LoRA layer's base layer)."""
    return module if type(module) is torch.nn.Linear else module.base_layer


def _lora_factors(module) -> Factors | None:
    """(A [R, in], B [out, R] * alpha/r) of a peft LoRA layer's active adapters (several: stacked,
    so B A is their sum), or None for a plain layer or one whose adapters are switched off."""
    if type(module) is torch.nn.Linear or module.disable_adapters:
        return None
    names = [n for n in module.active_adapters if n in module.lora_A]
    if not names:
        return None
    a = torch.cat([module.lora_A[n].weight for n in names])
    b = torch.cat([module.lora_B[n].weight * module.scaling[n] for n in names], dim=1)
    return a, b


def _covered_linears(model) -> bool:
    """Every projection is a plain nn.Linear or a plain peft LoRA layer over one. Anything else (a
    quantised layer, DoRA, a LoRA bias, dropout while training, adapters merged into the weight)
    keeps terms outside what `layers` reads, so reading the weights directly would drop them."""
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if not all(type(x) is torch.nn.Linear or _plain_lora(x) for x in mods):
            return False
    return type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding


def _plain_lora(module) -> bool:
    """A peft `lora.Linear` computing exactly base(x) + sum over its active adapters of
    B(A(x)) * scaling: no variant (DoRA), no bias of its own, no active dropout, not merged."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return False
    if type(module) is not LoraLinear or type(module.base_layer) is not torch.nn.Linear:
        return False
    if module.merged or module.fan_in_fan_out or getattr(module, "lora_variant", {}):
        return False
    dtype = module.base_layer.weight.dtype
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if module.lora_bias.get(name) or module.use_dora.get(name):
            return False
        if module.lora_A[name].weight.dtype != dtype or module.lora_B[name].weight.dtype != dtype:
            return False
        drop = module.lora_dropout[name]
        if not (isinstance(drop, torch.nn.Identity) or (drop.p == 0 or not drop.training)):
            return False
    return True


@dataclass
class Shared:
    """Distinct prefixes of a padded [B, S] batch. A token's hidden state depends only on the
    real tokens up to it (positions count real tokens; attention never reaches padding), so
    rows that start alike (a group's samples share their prompt, often their first answer
    tokens too) share those states: compute each once, gather where needed. Gradients are
    exact: the gather's backward sums every row's contribution into the shared state."""

    owner: torch.Tensor
    """[N] flat position (b * S + t) where each distinct prefix's last token is computed."""
    slot: torch.Tensor
    """[B * S] index into the N distinct prefixes for each position (0 for padding)."""


def shared_prefixes(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Shared:
    """A trie over each row's real tokens: one node per distinct prefix."""
    b, s = input_ids.shape
    nodes: dict[tuple[int, int], int] = {}
    owner: list[int] = []
    slot = [0] * (b * s)
    for r, (row, keep) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
        parent = -1
        for t, (tok, real) in enumerate(zip(row, keep)):
            if not real:
                continue
            node = nodes.setdefault((parent, tok), len(owner))
            if node == len(owner):
                owner.append(r * s + t)
            slot[r * s + t] = parent = node
    device = input_ids.device
    return Shared(torch.tensor(owner, device=device), torch.tensor(slot, device=device))


def _one_query_attention(q, k, v, bias) -> torch.Tensor:
    """Attention for one new token per row: q [B, h, 1, D], k/v [B, hk, T, D], bias [B, 1, 1, T].

    Two small batched matmuls; CPU SDPA's blocked kernel costs about twice as much at this
    shape (measured). Query heads are grouped by the key/value head they read, as
    transformers' repeat_kv orders them, so grouped-query attention needs no copy of k/v."""
    b, h, _, d = q.shape
    hk = k.shape[1]
    scores = torch.matmul(q.reshape(b, hk, h // hk, d), k.transpose(-1, -2)).mul_(d**-0.5)  # [B, hk, h/hk, T]
    if bias is not None:
        scores = scores + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(b, h, 1, d)


def _segment_attention(q, k, v, segments: list[int], gqa: bool) -> torch.Tensor:
    """Causal attention inside each packed sequence: q [1, h, S, D], k/v [1, hk, S, D] -> [1, h, S, D].

    One causal SDPA call per sequence, on that sequence's slice only: no [S, S] block mask is
    built (a long packed micro-batch would need S^2 of them), and no query can see another
    sequence's keys, since they are not in its call."""
    out, start = [], 0
    for n in segments:
        end = start + n
        out.append(F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                                                  is_causal=True, enable_gqa=gqa))
        start = end
    return torch.cat(out, dim=2)


def _spread(t: torch.Tensor, share: Shared | None, b: int, s: int) -> torch.Tensor:
    """[N, heads, D] per distinct prefix -> [B, S, heads, D] per position (differentiable gather)."""
    if share is None:
        return t
    return take_rows(t, share.slot).view(b, s, *t.shape[1:])


def take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`t[index]` for a 1-d `index` that may repeat rows, with a backward that sums the same way on
    every run: a shared prefix's gradient (the sum over the rows that read it) is then the same bits
    from one run to the next, so a real-model run repeats.

    Indexing's backward is `index_put_(accumulate=True)`, which on the CPU adds a repeated row's
    contributions from several threads at once (atomic float adds in whatever order the threads
    reach them; PyTorch lists it among its nondeterministic ops): the learner's gradients differed
    in their last bits from run to run on SmolLM2, and the runs drew other samples a few steps on.
    `index_select`'s backward (`index_add_`) adds them in index order on the CPU
    (benchmarks/repeatable_runs.py: two runs of the real recipe the same bits). On CUDA it is the
    other way round: `index_add_` uses atomics and indexing's backward sorts the indices first, so
    CUDA keeps indexing."""
    return t.index_select(0, index) if t.device.type == "cpu" else t[index]


def padding_bias(key_valid: torch.Tensor, queries: int, dtype) -> torch.Tensor:
    """Additive mask [B, 1, Q, T] for the last Q of T columns: causal, real keys only.

    Every position may also see itself, so a padding query never has an empty row (an empty
    row would give NaN, and NaN keys poison later steps even when masked)."""
    t = key_valid.shape[1]
    cols = torch.arange(t, device=key_valid.device)
    rows = cols[t - queries :, None]
    allowed = (cols[None] <= rows) & key_valid[:, None, :].bool()  # [B, Q, T]
    allowed |= cols[None] == rows
    bias = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device).masked_fill_(~allowed, float("-inf"))
    return bias[:, None]
