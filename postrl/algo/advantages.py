"""Group-relative advantages: each completion is judged against the other attempts at the same prompt.

rewards: [G, N] (G groups of N samples) -> advantages: [G, N].
"""

from __future__ import annotations

import torch

from postrl.registry import Registry

ADVANTAGES = Registry("advantage estimator", key="rl.advantage")
register_advantage = ADVANTAGES.register


@register_advantage("grpo")
def grpo(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A = r - mean(group), optionally / (std(group) + eps).

    std is the unbiased sample std, as in GRPO's reference implementations. Dr. GRPO
    (scale_by_std=False) drops the division: scaling by std up-weights groups whose rewards
    barely differ (near-solved or near-hopeless prompts), a bias toward those difficulty extremes.
    A group whose rewards are all equal gets zero advantage either way: it carries no signal.
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # [G, N]
    if scale_by_std:
        centred = centred / (rewards.std(dim=-1, keepdim=True) + eps)
    return centred


@register_advantage("rloo")
def rloo(rewards: torch.Tensor, scale_by_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Leave-one-out baseline: A_i = r_i - mean_{j != i} r_j = N/(N-1) * (r_i - mean). Unbiased."""
    n = rewards.shape[-1]
    adv = (rewards - rewards.mean(dim=-1, keepdim=True)) * n / max(n - 1, 1)  # [G, N]
    if scale_by_std:
        adv = adv / (rewards.std(dim=-1, keepdim=True) + eps)
    return adv


@register_advantage("reinforce_pp")
def reinforce_pp(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): A = (r - mean(batch)) / (std(batch) + eps), over all G*N rewards at once.

    No per-prompt baseline: normalising over the whole batch (not each group) keeps one easy or
    hard prompt's tiny spread from inflating its advantages, the bias the paper finds in GRPO. The
    KL to the reference goes into the reward (`rl.kl_in: reward`): `group_advantages` subtracts it
    before this estimator sees the rewards. A batch whose rewards are all equal gets zero advantage.
    """
    centred = rewards - rewards.mean()  # [G, N]
    if scale_by_std:
        centred = centred / (rewards.std() + eps)
    return centred


def fill_unverified(rewards: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """rewards, verified: [G, N]. Unverified entries take the mean of their group's verified ones (0 if none)."""
    v = verified.float()
    group_mean = (rewards * v).sum(-1, keepdim=True) / v.sum(-1, keepdim=True).clamp(min=1)  # [G, 1]
    return torch.where(verified, rewards, group_mean.expand_as(rewards))


def group_advantages(
    estimator, rewards: torch.Tensor, verified: torch.Tensor, penalty: torch.Tensor | None, scale_by_std: bool,
) -> torch.Tensor:
    """rewards, verified: [G, N]; penalty: [G*N] or None -> advantages [G*N].

    A sample the verifier could not grade (timeout, error) is no evidence either way: it gets its
    group's mean verified reward for the baseline and exactly zero advantage. `penalty` (the KL
    to the reference when it goes into the reward, PPO-RLHF style) is subtracted after that fill.
    """
    n = rewards.shape[-1]
    filled = fill_unverified(rewards, verified).flatten()  # [B]
    if penalty is not None:
        filled = filled - penalty
    adv = estimator(filled.view(-1, n), scale_by_std=scale_by_std).flatten()  # [B]
    return torch.where(verified.flatten(), adv, torch.zeros_like(adv))
