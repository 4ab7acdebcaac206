"""Advantage estimators, registered by the name `rl.advantage` gives them.

From rewards alone (each completion judged against the other attempts at the same prompt, or the
batch): rewards [G, N] (G groups of N samples) -> advantages [G, N].
From a learned value model (`AdvantageFacts.needs_values`: gae): per-token rewards and values
[B, T] -> per-token advantages and returns [B, T].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.registry import Registry


@dataclass(frozen=True)
class AdvantageFacts:
    """What an advantage estimator registers beside its function."""

    needs_values: bool = False
    """It reads a value model's per-token values (`critic.model`) and gives per-token advantages,
    instead of one advantage a completion from the rewards alone."""


ADVANTAGES = Registry("advantage estimator", key="rl.advantage", facts=AdvantageFacts)
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


@register_advantage("gae", needs_values=True)
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), PPO's estimator with a critic.

    rewards, values, mask: [B, T]; mask is 1 on the action tokens. Going backwards over a row's
    action tokens t (positions where mask is 0, a multi-turn episode's tool output, are skipped:
    the state after an action is the next action's state),
        delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lam * A_next,
    with V_next = A_next = 0 after the last action. Returns (advantages, returns = A + V), both 0
    off the mask. With gamma = lam = 1 each A_t is the row's reward sum from t on minus V_t.
    """
    adv = torch.zeros_like(values)
    carry = torch.zeros_like(values[:, 0])  # [B] A of the next action token
    next_value = torch.zeros_like(carry)
    for t in reversed(range(values.shape[1])):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        carry = torch.where(on, delta + gamma * lam * carry, carry)
        next_value = torch.where(on, values[:, t], next_value)
        adv[:, t] = torch.where(on, carry, torch.zeros_like(carry))
    return adv, (adv + values) * mask


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """values, mask: [B, T] -> (values - mean) / (std + eps) over the masked entries, 0 elsewhere
    (the unbiased std, as `grpo`'s). PPO normalises GAE's advantages over the batch this way."""
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1)
    var = (((values - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return (values - mean) / (var.sqrt() + eps) * mask


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
