"""Policy losses, KL estimators and loss aggregations, as pure functions of per-token tensors,
each registered by the name a recipe gives it (`rl.loss`, `rl.kl_estimator`, `rl.loss_agg`).

Shapes: B completions, T token positions; `mask` [B, T] is 1 on completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from postrl.registry import Registry


@dataclass(frozen=True)
class LossFacts:
    """What a policy loss registers beside its function."""

    token_weight: bool = True
    """Whether it can take a per-token importance weight (`is_weight`: decoupled PPO on stale rows,
    a rollout correction); a sequence-level loss cannot, and the config check refuses the pair."""
    token_advantage: bool = True
    """Whether it can take one advantage a token ([B, T]: `rl.advantage: gae`) besides one a
    completion ([B]); a loss with one ratio a sequence cannot, and the config check refuses the pair."""


LOSSES = Registry("policy loss", key="rl.loss", facts=LossFacts)
register_loss = LOSSES.register
KL_ESTIMATORS = Registry("KL estimator", key="rl.kl_estimator")
"""Name -> per-token estimate of KL(policy || reference) from log r = ref_logp - logp, [B, T] -> [B, T]."""


@dataclass(frozen=True)
class AggregationFacts:
    """What a loss aggregation registers beside its reduction: the rule that splits it over parts
    of a minibatch. It has no default, so an aggregation without a rule cannot be registered."""

    share: Callable[[torch.Tensor, torch.Tensor], float]
    """(a part's mask [b, T], its minibatch's mask [B, T]) -> the weight of the part's aggregate in
    the minibatch's: gradient accumulation over micro-batches (and data-parallel ranks) sums the
    parts' losses times these weights, which gives the minibatch's loss."""
    needs_budget: bool = False
    """Whether it divides by the generation budget (a constant, not a count of the batch): its
    reduction then takes `budget`, which `Aggregation` carries."""


LOSS_AGGREGATIONS = Registry("loss aggregation", key="rl.loss_agg", facts=AggregationFacts)
"""Name -> reduction of per-token values [B, T] over the masked tokens to a scalar; its facts
(`LOSS_AGGREGATIONS.facts(name).share`) hold its micro-batch weight rule."""


@dataclass(frozen=True)
class Aggregation:
    """`rl.loss_agg` with what it may need beside the tensors: the learner builds one and passes it
    to the loss; a bare name (str) stands for an aggregation that needs no budget."""

    name: str
    budget: int = 0
    """The generation budget (tokens) a budget-normalised aggregation divides by; 0 = none given."""

    def __call__(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        reduce = LOSS_AGGREGATIONS.get(self.name)
        if LOSS_AGGREGATIONS.facts(self.name).needs_budget:
            return reduce(values, mask, self.budget)
        return reduce(values, mask)


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str | Aggregation) -> torch.Tensor:
    """Reduce [B, T] to a scalar over masked tokens with the aggregation `agg` (a name or an `Aggregation`)."""
    return (Aggregation(agg) if isinstance(agg, str) else agg)(values, mask)


def token_share(part_mask: torch.Tensor, mask: torch.Tensor) -> float:
    """token-mean divides by the minibatch's token count, so a part holding n of its N tokens
    weighs n / N (not 1 / number-of-parts: micro-batches hold different token counts)."""
    return float(part_mask.sum() / mask.sum().clamp(min=1))


def sequence_share(part_mask: torch.Tensor, mask: torch.Tensor) -> float:
    """seq-mean-token-mean averages per-completion means, so a part of b of B completions weighs b / B."""
    return part_mask.shape[0] / mask.shape[0]


@LOSS_AGGREGATIONS.register("token-mean", share=token_share)
def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every token in the batch weighs the same, so long completions count in proportion to their
    length (DAPO's choice; avoids GRPO's bias toward short correct / long wrong answers)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean", share=sequence_share)
def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average within each completion, then across completions (original GRPO)."""
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return per_seq.mean()


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm", share=sequence_share, needs_budget=True)
def seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, budget: int) -> torch.Tensor:
    """Dr. GRPO's constant normaliser (Liu et al. 2025, "Understanding R1-Zero-Like Training",
    section 3.1; verl's name): each completion's token sum over the generation budget L, averaged
    over the B completions, i.e. sum(values * mask) / (B * L).

    Dividing by each completion's own length (GRPO) makes a wrong long reply's per-token penalty
    smaller than a wrong short one's, so the policy learns that long wrong answers are cheap: the
    length bias Dr. GRPO removes. L is a constant (`rl.loss_agg_budget`, by default
    train.max_new_tokens), so every token of every reply weighs the same in every step.
    """
    if budget < 1:
        raise ValueError(f"seq-mean-token-sum-norm divides by the generation budget, got {budget}")
    return (values * mask).sum() / (mask.shape[0] * budget)


def token_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """[B] (one advantage a completion) -> [B, 1], broadcast over its tokens; [B, T] (one a token,
    GAE) as it is."""
    return advantages[:, None] if advantages.dim() == 1 else advantages


@dataclass
class LossStats:
    clip_frac: float
    """Share of tokens whose ratio was clipped in the direction the advantage pushes."""
    ratio_mean: float


@register_loss("ppo_clip")
def ppo_clip(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] behaviour policy
    advantages: torch.Tensor,  # [B], or [B, T] one a token
    mask: torch.Tensor,  # [B, T]
    clip_low: float,
    clip_high: float,
    agg: str | Aggregation,
    is_weight: torch.Tensor | None = None,  # [B, T] off-policy correction, no gradient; None = 1
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip surrogate with separate ranges: ratio in [1 - clip_low, 1 + clip_high] (clip-higher).

    loss_t = -w_t * min(ratio_t * A, clip(ratio_t) * A); a wider upper range lets unlikely tokens with
    positive advantage grow faster, which keeps entropy from collapsing (DAPO). `old_logp` is the
    policy the trust region is centred on; when the samples came from an older policy, `is_weight`
    carries the importance weight from that policy to `old_logp`'s (see `truncated_is_weight`).
    """
    ratio = torch.exp(logp - old_logp)  # [B, T]
    adv = token_advantages(advantages)  # [B, 1] or [B, T]
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
    return KL_ESTIMATORS.get(estimator)(ref_logp - logp)


@KL_ESTIMATORS.register("k1")
def k1(log_r: torch.Tensor) -> torch.Tensor:
    return -log_r


@KL_ESTIMATORS.register("k2")
def k2(log_r: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_r**2


@KL_ESTIMATORS.register("k3")
def k3(log_r: torch.Tensor) -> torch.Tensor:
    # clamp keeps exp() finite when the policy has moved far from the reference
    return torch.exp(log_r.clamp(max=20.0)) - 1 - log_r


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


def _clip_stats(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> LossStats:
    """ratio, mask: [B, T]; adv: [B, 1] or [B, T]. Share of masked tokens clipped in the advantage's direction."""
    with torch.no_grad():
        was_clipped = ((ratio < 1 - low) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
        n = mask.sum().clamp(min=1)
        return LossStats(clip_frac=float((was_clipped.float() * mask).sum() / n),
                         ratio_mean=float((ratio * mask).sum() / n))


@register_loss("gspo", token_weight=False, token_advantage=False)
def gspo(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] behaviour policy
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor,  # [B, T]
    clip_low: float,
    clip_high: float,
    agg: str | Aggregation,
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one importance ratio a completion.

    s_i = exp( (1/|y_i|) sum_t log(pi(y_t) / pi_old(y_t)) )   (geometric mean of the token ratios)
    loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)
    Written token-wise as the paper's GSPO-token: s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)] has the
    value s_i on every token and the gradient s_i * grad log pi(y_t), so with `seq-mean-token-mean`
    the gradient is exactly grad s_i * A_i: (1/|y_i|) sum_t s_i A_i grad log pi(y_t), spread evenly
    over the completion's tokens. The whole sequence is clipped or not. The paper's ranges are far
    narrower than PPO's (3e-4 / 4e-4) because a sequence ratio moves much less than a token one.
    A token-level importance weight cannot be used: it would break the one-ratio-a-sequence rule.
    """
    if is_weight is not None:
        raise ValueError("gspo takes no token-level importance weight (rl.loss=gspo with a rollout correction)")
    if advantages.dim() != 1:
        raise ValueError("gspo takes one advantage a completion (rl.loss=gspo with rl.advantage=gae)")
    n_tok = mask.sum(-1).clamp(min=1)  # [B]
    log_s = ((logp - old_logp) * mask).sum(-1) / n_tok  # [B]
    seq_ratio = torch.exp(log_s.detach()[:, None] + logp - logp.detach())  # [B, T], value s_i on every token
    adv = advantages[:, None]  # [B, 1]
    clipped = seq_ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(seq_ratio * adv, clipped)  # [B, T]
    return aggregate(per_token, mask, agg), _clip_stats(seq_ratio, adv, mask, clip_low, clip_high)


@register_loss("cispo")
def cispo(
    logp: torch.Tensor,  # [B, T] current policy
    old_logp: torch.Tensor,  # [B, T] behaviour policy
    advantages: torch.Tensor,  # [B], or [B, T] one a token
    mask: torch.Tensor,  # [B, T]
    clip_low: float,
    clip_high: float,
    agg: str | Aggregation,
    is_weight: torch.Tensor | None = None,  # [B, T] off-policy correction, no gradient; None = 1
) -> tuple[torch.Tensor, LossStats]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, not the update.

    loss_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A * log pi(y_t),  r_t = pi(y_t) / pi_old(y_t)
    The clipped weight is detached, so every token keeps its REINFORCE gradient -w_t * A * grad log pi
    (PPO's clip zeroes it on clipped tokens, which drops the rare "fork" tokens reasoning depends on);
    the clip only bounds how much one token's gradient can be up-weighted. MiniMax-M1 uses
    `token-mean` and sets only the upper range in practice (a large clip_low means no lower bound).
    """
    ratio = torch.exp(logp - old_logp).detach()  # [B, T]
    adv = token_advantages(advantages)  # [B, 1] or [B, T]
    per_token = -ratio.clamp(1 - clip_low, 1 + clip_high) * adv * logp  # [B, T]
    if is_weight is not None:
        per_token = is_weight.detach() * per_token
    return aggregate(per_token, mask, agg), _clip_stats(ratio, adv, mask, clip_low, clip_high)
