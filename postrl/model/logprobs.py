"""Per-token log-probabilities and entropy of completions under a model.

    logp, ent = token_logprobs(model, ids, attn, temps, with_entropy=True, needed=loss_mask,
                               pack=True, chunk_mib=16)

Memory that grows gently with length (what this module does not know: losses, batches, the run):

  - Only the positions that predict completion tokens reach the vocabulary head (`needed`, the
    loss mask): prompt positions cost the backbone, not the head.
  - The head is applied **chunk by chunk** of positions, each chunk's [rows, V] logits at most
    `chunk_mib` MiB of float32, so [all tokens x vocabulary] is never materialised. Under autograd
    each chunk is checkpointed: its logits are freed after the forward and recomputed for its
    backward, so the backward holds one chunk's logits at a time as well. logp(token) =
    logit[token] - logsumexp(logits) needs no second [rows, V] tensor; the entropy is
    logsumexp - E_p[logit]. When every position fits one chunk (any small vocabulary, e.g. the
    built-in tiny models) the computation is exactly the unchunked one, bit for bit.
  - **Packing** (`pack=True`): the rows' real tokens are laid back to back in one [1, N] sequence
    whose position ids restart at 0 for each row, so no padding is computed at all. Attention stays
    inside each sequence: FastLM runs one causal attention per sequence (`segments`); a Hugging
    Face model gets the packed position ids and no attention mask, from which transformers builds
    its block-causal mask (`find_packed_sequence_indices`; the cache is off, without which it
    would not look). Results come back in the caller's [B, T-1] layout, so losses are unchanged.

Llama-family models run through `FastLM`: the same function with far fewer Python-level ops,
causal SDPA without any mask tensor when rows are right-padded (as the learner's are), and every
distinct prefix computed once, so padding costs nothing and a group's shared prompt is run (and
back-propagated) once rather than once per sample; plain LoRA adapters included (`FastLM` adds
their low-rank terms). Where FastLM does not cover the adapters, or a wrapper hides the model
(gradient checkpointing), the model's own decoder runs, then the same chunked head; any other
architecture runs its whole forward (which may scale or cap logits), whose logits of the needed
columns are materialised. Those forwards get an all-ones attention mask for right-padded rows, for
which transformers builds no mask tensor either (causal attention keeps real tokens off the
padding after them; the padding positions' own outputs are never read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from postrl.model.fastlm import COVERED, FastLM, hf_model, padding_bias, shared_prefixes, take_rows

LOGITS_CHUNK_MIB = 16
"""One chunk of float32 logits on the CPU, where `model.logits_chunk_mib` is 0 (its default)."""
ACCELERATOR_LOGITS_CHUNK_MIB = 256
"""One chunk on an accelerator, where `model.logits_chunk_mib` is 0. Measured on an H200
(`benchmarks/gpu_suite.py --sections learner --logits-chunk-mib N`, a Qwen2.5-0.5B shape with its
151,936-word head, 16k tokens an update, bf16, full and LoRA, 1k and 4k sequences): 16 MiB chunks
(27 positions each) held the update at 12-13k tokens/s, 3-5% of the bf16 peak, the head's hundreds
of small launches and recomputations dominating; 256 MiB ran 40-57k tokens/s (3.3-4.7x) for at most
1 GiB more; 1024 MiB 2-8% more again for 4 GiB more."""


def logits_chunk_mib(configured: float, device: torch.device) -> float:
    """`model.logits_chunk_mib` as set, or where it is 0 the default for `device`'s kind."""
    if configured:
        return configured
    return LOGITS_CHUNK_MIB if device.type == "cpu" else ACCELERATOR_LOGITS_CHUNK_MIB


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    needed: torch.Tensor | None = None,
    *,
    pack: bool = False,
    chunk_mib: float = 0,
    compiled: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """input_ids, attention_mask: [B, T]; temperature: [B]; needed: optional [B, T-1] mask.

    Returns logp [B, T-1] where logp[:, t] = log p(input_ids[:, t+1] | prefix) at each row's
    temperature, and the entropy [B, T-1] of that distribution (or None). Where `needed` is
    given, positions outside it are 0 in both. The entropy carries a gradient only when
    `entropy_grad` (an entropy bonus); as a metric it is computed detached. `pack`: run the rows
    as one packed sequence (no padding computed; with `needed` None every real position counts).
    `chunk_mib`: the largest float32 logits chunk (0: `logits_chunk_mib`'s default for the device).
    `compiled`: a torch.compile backend for FastLM's layers ("inductor": `train.compile`; None: eager;
    forwards other than FastLM's ignore it)."""
    chunk_mib = logits_chunk_mib(chunk_mib, input_ids.device)
    targets = input_ids[:, 1:]
    temps = temperature[:, None].expand(targets.shape)
    keep = needed.bool() if needed is not None else None
    if pack and keep is None:
        keep = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
    if pack:
        hidden, head = _packed_hidden(model, input_ids, attention_mask, keep, compiled)  # [N, H]
    else:
        hidden, head = _final_hidden(model, input_ids, attention_mask, keep, compiled)  # [B, T-1, H] or [N, H]
    if keep is not None:
        targets, temps = targets[keep], temps[keep]  # [N]
    logp, entropy = _chunked_logprobs(hidden.flatten(0, -2), head, targets.flatten(), temps.flatten(),
                                      with_entropy, entropy_grad, chunk_mib)
    if keep is None:
        return logp.view(targets.shape), (None if entropy is None else entropy.view(targets.shape))
    return _scatter(logp, keep), (None if entropy is None else _scatter(entropy, keep))


def token_values(model, value_head, input_ids: torch.Tensor, attention_mask: torch.Tensor, needed: torch.Tensor,
                 *, pack: bool = False) -> torch.Tensor:
    """A value model's outputs [B, T-1]: `value_head` ([H] -> [1]) on `model`'s final hidden states
    at the positions `needed` marks (position t: the state before token t+1 is chosen), 0 elsewhere;
    the same backbone passes as `token_logprobs` (FastLM, shared prompts, packing), without the
    vocabulary head. A ValueError for a model whose hidden states no pass here reaches."""
    if not has_backbone(model):
        raise ValueError(f"a value head reads a decoder's hidden states; {type(model).__name__} is not a "
                         f"model this module splits (Llama-family: {', '.join(sorted(COVERED))})")
    keep = needed.bool()
    if pack:
        hidden, _ = _packed_hidden(model, input_ids, attention_mask, keep)  # [N, H]
    else:
        hidden, _ = _final_hidden(model, input_ids, attention_mask, keep)  # [N, H]
    return _scatter(value_head(hidden).squeeze(-1).float(), keep)


def has_backbone(model) -> bool:
    """Whether `model`'s final hidden states are reachable without its head (`token_values`)."""
    return FastLM.wrap(model) is not None or _decoder_and_head(model) is not None


# ---------------------------------------------------------------------------- the backbone


def hf_decoder_and_head(model):
    """(decoder, head) of a Llama-family causal LM, a peft-wrapped one included, whose logits are
    exactly `head(decoder(...).last_hidden_state)`; None for any other model. The decoder runs the
    model's own layers (adapters and gradient checkpointing included)."""
    inner = hf_model(model)
    cfg = getattr(inner, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in COVERED:
        return None
    decoder, head = getattr(inner, "model", None), getattr(inner, "lm_head", None)
    if decoder is None or head is None:
        return None
    return decoder, head


def _decoder_and_head(model):
    """Wrappers (the adapter-free reference, the checkpointing forward) say how to split themselves."""
    split = getattr(model, "decoder_and_head", None)
    return split() if split is not None else hf_decoder_and_head(model)


def _final_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor | None,
                  compiled: str | None = None):
    """Final hidden states at the positions that predict a next token ([B, T-1, H], or [N, H] at
    `keep`), and the vocabulary head to apply to them."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    # right-padded rows (the learner's layout): plain causal attention never lets a real token
    # see padding, so no mask tensor is built at all (SDPA's flash and memory-efficient kernels
    # take is_causal, not a [T, T] mask); only the padding positions, never read, see other padding
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
    lm = FastLM.wrap(model)
    if lm is None:
        # transformers skips its mask for an all-ones attention_mask (is_causal); given the padding,
        # or none at all (the padding's repeated position ids then read as packed sequences), it
        # builds a [B, 1, T, T] one
        attn = torch.ones_like(attention_mask) if right_padded else attention_mask
        split = _decoder_and_head(model)
        if split is not None:
            decoder, head = split
            out = decoder(input_ids=input_ids, attention_mask=attn, position_ids=positions, use_cache=False)
            hidden = out.last_hidden_state[:, :-1]  # [B, T-1, H]
            return (hidden if keep is None else hidden[keep]), head
        return _whole_forward(model, input_ids, attn, positions, keep)
    width = input_ids.shape[1]
    cos, sin = lm.rotary(width)
    bias = None if right_padded else padding_bias(attention_mask, width, lm.dtype)
    # padding is skipped and a group's shared prompt runs once (its gradient summed over the group)
    share = shared_prefixes(input_ids, attention_mask)
    hidden = lm.hidden(input_ids, cos[positions], sin[positions], bias, lm.layers(), causal=True, share=share,
                       compiled=compiled)
    slot = share.slot.view(input_ids.shape)[:, :-1]  # [B, T-1] distinct-prefix row of each position
    rows = slot if keep is None else slot[keep]
    return take_rows(hidden, rows.flatten()).view(*rows.shape, hidden.shape[-1]), lm.logits


def _whole_forward(model, input_ids, attention_mask, positions, keep):
    """Other architectures: their own forward (which may scale or cap logits), identity head.
    Columns before the first needed one never reach the vocabulary head (`logits_to_keep` counts
    columns from the end): with a large vocabulary the prompt columns' [B, T, V] logits and their
    gradient would otherwise be most of the memory."""
    first = 0 if keep is None or not bool(keep.any()) else int(keep.any(0).nonzero()[0])
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                logits_to_keep=input_ids.shape[1] - first)
    logits = out.logits[:, :-1]  # [B, T-1-first, V]: the predictions made at columns first..T-2
    return (logits if keep is None else logits[keep[:, first:]]), (lambda x: x)


@dataclass
class Packing:
    """Rows' real tokens back to back: ids [1, N], positions [1, N] restarting at 0 per row,
    `lengths` of the rows, and `flat` [B, T]: each real token's index in the packed sequence."""

    ids: torch.Tensor
    positions: torch.Tensor
    lengths: list[int]
    flat: torch.Tensor


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packing:
    """Pack [B, T] rows (left- or right-padded) into one sequence; a row's tokens keep their order."""
    real = attention_mask.bool()
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    flat = (real.flatten().cumsum(0) - 1).view(real.shape)
    lengths = [n for n in attention_mask.sum(-1).tolist() if n > 0]
    return Packing(input_ids[real][None], positions[real][None], lengths, flat)


def _packed_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor,
                   compiled: str | None = None):
    """Final hidden states [N, H] at `keep` ([B, T-1]), the rows run as one packed sequence."""
    packed = pack_rows(input_ids, attention_mask)
    at = packed.flat[:, :-1][keep]  # [N] packed index of each kept position
    lm = FastLM.wrap(model)
    if lm is not None:
        cos, sin = lm.rotary(int(packed.positions.max()) + 1)
        pos = packed.positions
        hidden = lm.hidden(packed.ids, cos[pos], sin[pos], None, lm.layers(), segments=packed.lengths,
                           compiled=compiled)
        return hidden[0, at], lm.logits
    split = _decoder_and_head(model)
    # no attention mask and no cache: transformers then reads the restarting position ids as
    # packed sequences and masks attention block-causally, one block per row
    if split is None:
        out = model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False)
        return out.logits[0, at], (lambda x: x)
    decoder, head = split
    out = decoder(input_ids=packed.ids, position_ids=packed.positions, use_cache=False)
    return out.last_hidden_state[0, at], head


# ---------------------------------------------------------------------------- the chunked head


def chunk_rows(vocab: int, chunk_mib: float) -> int:
    """Positions per head chunk: as many [V] float32 logit rows as fit in `chunk_mib` MiB."""
    return max(1, int(chunk_mib * 2**20) // (4 * vocab))


def _chunked_logprobs(hidden, head, targets, temps, with_entropy: bool, entropy_grad: bool, chunk_mib: float):
    """hidden [N, H] (or [N, V] logits with an identity head), targets [N], temps [N] ->
    logp [N], entropy [N] or None, computed `chunk_rows` positions at a time."""

    def chunk(h, t, tau):
        return _head_logprobs(head(h), t, tau, with_entropy, entropy_grad)

    vocab = _vocab_size(head, hidden)
    rows = chunk_rows(vocab, chunk_mib)
    if hidden.shape[0] <= rows:
        return chunk(hidden, targets, temps)  # one chunk: exactly the unchunked computation
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, hidden.shape[0], rows):
        args = (hidden[start : start + rows], targets[start : start + rows], temps[start : start + rows])
        # checkpointed: the chunk's [rows, V] logits are recomputed in its backward, not kept
        parts.append(checkpoint(chunk, *args, use_reentrant=False) if recompute else chunk(*args))
    logp = torch.cat([p[0] for p in parts])
    return logp, (torch.cat([p[1] for p in parts]) if with_entropy else None)


def _vocab_size(head, hidden: torch.Tensor) -> int:
    weight = getattr(head, "weight", None)  # an nn.Linear (possibly LoRA-wrapped)
    if weight is None and hasattr(head, "__self__"):  # FastLM.logits: the model's lm_head
        weight = head.__self__.model.lm_head.weight
    return int(weight.shape[0]) if weight is not None else int(hidden.shape[-1])


def _head_logprobs(logits, targets, temps, with_entropy: bool, entropy_grad: bool):
    """logits [..., V], targets [...], temps [...] -> logp [...], entropy [...] or None."""
    logits = logits.float() / temps[..., None]
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        if not entropy_grad:
            logits, lse = logits.detach(), lse.detach()
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)  # H = logsumexp - E_p[logit]
    return logp, entropy


def _scatter(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """values [N] back into zeros [B, T-1] at `keep`, differentiably."""
    out = torch.zeros(keep.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(keep, values)
