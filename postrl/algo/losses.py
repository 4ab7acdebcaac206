"""Policy losses, KL estimators and entropy, as pure functions of per-token tensors.

Shapes: B completions, T token positions; `mask` [B, T] is 1 on completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.algo.registry import Registry

LOSSES = Registry("policy loss")
register_loss = LOSSES.register


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce [B, T] to a scalar over masked tokens.

    token-mean: every token in the batch weighs the same, so long completions count in proportion
      to their length (DAPO's choice; avoids GRPO's bias toward short correct / long wrong answers).
    seq-mean-token-mean: average within each completion, then across completions (original GRPO).
    """
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        return per_seq.mean()
    raise ValueError(f"unknown loss aggregation {mode!r}")


@dataclass
class LossStats:
    clip_frac: float
    """Share of tokens whose ratio was clipped in the direction the advantage pushes."""
    ratio_mean: float


@register_loss("ppo_clip")
def ppo_clip(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] behaviour policy
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, T]
    clip_low: float,
    clip_high: float,
    agg: str,
    is_weight: torch.Tensor | None = None,  # [B, T] off-policy correction, no gradient; None = 1
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip surrogate with separate ranges: ratio in [1 - clip_low, 1 + clip_high] (clip-higher).

    loss_t = -w_t * min(ratio_t * A, clip(ratio_t) * A); a wider upper range lets unlikely tokens with
    positive advantage grow faster, which keeps entropy from collapsing (DAPO). `old_logp` is the
    policy the trust region is centred on; when the samples came from an older policy, `is_weight`
    carries the importance weight from that policy to `old_logp`'s (see `truncated_is_weight`).
    """
    ratio = torch.exp(logp - old_logp)  # [B, T]
    adv = advantages[:, None]  # [B, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    if is_weight is not None:
        per_token = is_weight.detach() * per_token
    loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        was_clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = mask.sum().clamp(min=1)
        stats = LossStats(
            clip_frac=float((was_clipped.float() * mask).sum() / n), ratio_mean=float((ratio * mask).sum() / n)
        )
    return loss, stats


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy. [B, T] -> [B, T].

    With log r = ref_logp - logp (r = p_ref / p_policy):
      k1 = -log r                unbiased, high variance, can be negative
      k2 = (log r)^2 / 2         biased, low variance, gradient matches the true KL's to first order
      k3 = (r - 1) - log r       unbiased and always >= 0 (Schulman, "Approximating KL divergence")
    """
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        # clamp keeps exp() finite when the policy has moved far from the reference
        return torch.exp(log_r.clamp(max=20.0)) - 1 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}")


def truncated_is_weight(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token importance weight min(pi_prox / pi_behav, cap), [B, T] -> [B, T], no gradient.

    Decoupled PPO (Hilton et al. 2021; AReaL's asynchronous RL): with samples drawn from a stale
    behaviour policy pi_behav, the clipped ratio is taken against the proximal policy pi_prox (the
    trainer's weights when the batch is consumed) and the whole surrogate is reweighted by
    pi_prox / pi_behav. Truncating that weight at `cap` (TIS, as in verl's rollout correction)
    bounds the variance one very unlikely behaviour token can add; it biases the gradient only on
    tokens the stale policy under-sampled by more than a factor `cap`.
    """
    return torch.exp(prox_logp - behav_logp).clamp(max=cap).detach()
