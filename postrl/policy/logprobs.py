"""Per-token log-probabilities and entropy of completions under a model.

Only the positions that predict completion tokens matter, and the full-vocabulary
log-softmax is never kept: logp(token) = logit[token] - logsumexp(logits), which needs one
[N, V] reduction instead of a second [N, V] tensor (the usual out-of-memory cause on long
responses with large vocabularies). Pass `needed` (the loss mask) and the vocabulary
projection runs on those positions only: prompt positions cost the backbone, not the head.

Llama-family models run through `FastLM`: the same function with far fewer Python-level ops,
causal SDPA without any mask tensor when rows are right-padded (as the learner's are), and
every distinct prefix computed once, so padding costs nothing and a group's shared prompt is
run (and back-propagated) once rather than once per sample.
"""

from __future__ import annotations

import torch

from postrl.policy.fastlm import FastLM, padding_bias, shared_prefixes


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    needed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """input_ids, attention_mask: [B, T]; temperature: [B]; needed: optional [B, T-1] mask.

    Returns logp [B, T-1] where logp[:, t] = log p(input_ids[:, t+1] | prefix) at each row's
    temperature, and the entropy [B, T-1] of that distribution (or None). Where `needed` is
    given, positions outside it are 0 in both. The entropy carries a gradient only when
    `entropy_grad` (an entropy bonus); as a metric it is computed detached."""
    targets = input_ids[:, 1:]
    temps = temperature[:, None].expand(targets.shape)
    keep = needed.bool() if needed is not None else None
    hidden, head = _final_hidden(model, input_ids, attention_mask, keep)  # [B, T-1, H] or [N, H]
    if keep is not None:
        targets, temps = targets[keep], temps[keep]  # [N]
    logp, entropy = _head_logprobs(head(hidden), targets, temps, with_entropy, entropy_grad)
    if keep is None:
        return logp, entropy
    return _scatter(logp, keep), (None if entropy is None else _scatter(entropy, keep))


def _final_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor | None):
    """Final hidden states at the positions that predict a next token ([B, T-1, H], or [N, H] at
    `keep`), and the vocabulary head to apply to them."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    lm = FastLM.wrap(model)
    if lm is None:
        # other architectures (and LoRA models): their own forward (which may scale or cap logits),
        # identity head. Columns before the first needed one never reach the vocabulary head
        # (`logits_to_keep` counts columns from the end): with SmolLM2's 49k vocabulary the prompt
        # columns' [B, T, V] logits and their gradient would otherwise be most of the memory.
        first = 0 if keep is None or not bool(keep.any()) else int(keep.any(0).nonzero()[0])
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    logits_to_keep=input_ids.shape[1] - first)
        logits = out.logits[:, :-1]  # [B, T-1-first, V]: the predictions made at columns first..T-2
        return (logits if keep is None else logits[keep[:, first:]]), (lambda x: x)
    width = input_ids.shape[1]
    cos, sin = lm.rotary(width)
    # right-padded rows (the learner's layout): plain causal attention never lets a real token
    # see padding, so no mask tensor is built at all
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
    bias = None if right_padded else padding_bias(attention_mask, width, lm.dtype)
    # padding is skipped and a group's shared prompt runs once (its gradient summed over the group)
    share = shared_prefixes(input_ids, attention_mask)
    hidden = lm.hidden(input_ids, cos[positions], sin[positions], bias, lm.layers(), causal=True, share=share)
    slot = share.slot.view(input_ids.shape)[:, :-1]  # [B, T-1] distinct-prefix row of each position
    return hidden[slot if keep is None else slot[keep]], lm.logits


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
    out = torch.zeros(keep.shape, dtype=values.dtype)
    return out.masked_scatter(keep, values)
