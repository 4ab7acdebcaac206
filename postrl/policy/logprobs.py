"""Per-token log-probabilities and entropy of completions under a model.

Only the positions that predict completion tokens matter, and the full-vocabulary
log-softmax is never kept: logp(token) = logit[token] - logsumexp(logits), which needs one
[N, V] reduction instead of a second [N, V] tensor (the usual out-of-memory cause on long
responses with large vocabularies).
"""

from __future__ import annotations

import torch


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """input_ids, attention_mask: [B, T]; temperature: [B].

    Returns logp [B, T-1] where logp[:, t] = log p(input_ids[:, t+1] | prefix) at each row's
    temperature, and the entropy [B, T-1] of that distribution (or None). The entropy carries a
    gradient only when `entropy_grad` (an entropy bonus); as a metric it is computed detached."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
    logits = logits[:, :-1].float() / temperature[:, None, None]  # [B, T-1, V]
    targets = input_ids[:, 1:]
    lse = torch.logsumexp(logits, dim=-1)  # [B, T-1]
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        if not entropy_grad:
            logits, lse = logits.detach(), lse.detach()
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)  # H = logsumexp - E_p[logit]
    return logp, entropy
