"""Rollout correction: the train/inference mismatch, measured and corrected, as pure functions of
per-token log-probs (`rl.rollout_correction`; the learner applies them, `postrl.learner.learner`).

The sampler's behaviour log-probs (pi_behav) and the learner's recomputation on the same weights
(pi_learner) differ when an inference engine with kernels of its own samples (vLLM), or when a
weight sync did not land. `mismatch_stats` measures it; a correction (`CORRECTIONS`, by
`rl.rollout_correction.mode`) turns the per-token log-ratio log r = log pi_learner - log pi_behav
into the weight each token's policy-gradient term is multiplied by:

    tis         w = min(r, cap)                                    token-level truncated IS (Yao et al.)
    token_mask  w = r if low <= r <= cap, else 0                   token-level masked IS (IcePop)
    seq_mask    w = rho for every token of the sequence,            sequence-level masked IS (Seq-MIS),
                rho = exp(sum_t log r_t) over its tokens,          TRL's `sequence_mask`
                0 for the whole sequence unless low <= rho <= cap

seq_mask follows TRL (`vllm_importance_sampling_mode: sequence_mask`): each token of a kept
sequence is weighted by the sequence's ratio rho, not by its own r_t. That is the sequence-level
importance weight, unbiased for the sequence-level objective ("When Speed Kills Stability", Li and
Liu), and the mask bounds its variance. `low` = 0 masks nothing from below: a sequence with a
tiny rho already weighs about nothing.

Shapes: B completions, T token positions; `mask` [B, T] is 1 on trained completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.algo.losses import kl_estimate
from postrl.registry import Registry

CORRECTIONS = Registry("rollout correction", key="rl.rollout_correction.mode")
"""Name -> fn(log_ratio [B, T], mask [B, T], cap, low) -> `Correction`. `auto` and `none` are not
entries: the learner resolves auto, and none keeps decoupled PPO's weight on stale rows."""


@dataclass
class Correction:
    """What a correction makes of a batch's log-ratios."""

    weight: torch.Tensor
    """[B, T] per-token weight on the policy-gradient term, no gradient."""
    masked_frac: torch.Tensor
    """Share of the units it drops: tokens (token_mask) or sequences with a token (seq_mask); 0 for tis."""
    truncated_frac: torch.Tensor
    """Share of tokens whose weight was cut down to `cap` (tis); 0 for the mask modes."""


def token_share(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Share of the masked tokens where `flags` [B, T] is true."""
    return (flags.float() * mask).sum() / mask.sum().clamp(min=1)


@CORRECTIONS.register("tis")
def tis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float, low: float) -> Correction:
    """Truncated importance sampling: min(r, cap); `low` does not apply (a small weight is already small)."""
    r = torch.exp(log_ratio)  # [B, T]; inf past float range, which min() turns into cap
    zero = torch.zeros((), device=r.device)
    return Correction(r.clamp(max=cap).detach(), zero, token_share(r > cap, mask))


@CORRECTIONS.register("token_mask")
def token_mask(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float, low: float) -> Correction:
    """Masked importance sampling per token: r where low <= r <= cap, else 0 (the token is dropped)."""
    r = torch.exp(log_ratio)  # [B, T]
    keep = (r >= low) & (r <= cap)
    zero = torch.zeros((), device=r.device)
    return Correction(torch.where(keep, r, 0.0).detach(), token_share(~keep, mask), zero)


@CORRECTIONS.register("seq_mask")
def seq_mask(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float, low: float) -> Correction:
    """Masked importance sampling per sequence: every token weighted by the sequence ratio rho,
    the whole sequence dropped when rho is outside [low, cap]."""
    rho = torch.exp((log_ratio * mask).sum(-1))  # [B]
    keep = (rho >= low) & (rho <= cap)  # [B]
    weight = torch.where(keep, rho, 0.0)[:, None].expand_as(log_ratio)  # [B, T]
    rows = mask.sum(-1) > 0  # a row with no trained token is no sequence to drop
    masked = (~keep & rows).float().sum() / rows.float().sum().clamp(min=1)
    return Correction(weight.detach(), masked, torch.zeros((), device=rho.device))


def correction_stats(c: Correction, mask: torch.Tensor) -> dict[str, float]:
    """The correction's metrics over a batch: mean weight per trained token, the shares dropped and truncated."""
    return {
        "rollout_correction/weight_mean": float((c.weight * mask).sum() / mask.sum().clamp(min=1)),
        "rollout_correction/masked_frac": float(c.masked_frac),
        "rollout_correction/truncated_frac": float(c.truncated_frac),
    }


def mismatch_stats(learner_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the learner's log-probs [B, T] are from the sampler's on the same tokens and weights.

    logp_abs_diff_mean / _max: |log pi_behav - log pi_learner| per trained token, mean and max;
    seq_log_ratio_mean / _max: per sequence sum_t (log pi_learner - log pi_behav), the mean of it
    and the max of its absolute value, over rows with a trained token;
    kl_k3: k3 estimate of KL(pi_behav || pi_learner) per token (the tokens were drawn from pi_behav);
    tokens: the trained tokens measured. With none, only `mismatch/tokens` (0)."""
    n = mask.sum()
    if n == 0:
        return {"mismatch/tokens": 0.0}
    diff = (learner_logp - behav_logp) * mask  # [B, T]
    seq = diff.sum(-1)[mask.sum(-1) > 0]  # [sequences]
    kl = kl_estimate(behav_logp, learner_logp, "k3") * mask  # log r = learner - behav
    return {
        "mismatch/logp_abs_diff_mean": float(diff.abs().sum() / n),
        "mismatch/logp_abs_diff_max": float(diff.abs().max()),
        "mismatch/seq_log_ratio_mean": float(seq.mean()),
        "mismatch/seq_log_ratio_max": float(seq.abs().max()),
        "mismatch/kl_k3": float(kl.sum() / n),
        "mismatch/tokens": float(n),
    }
