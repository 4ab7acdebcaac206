"""PPO's critic: a value model, its own optimiser, and the GAE advantages it makes possible.

    critic = make_critic(cfg, policy.model, policy.tok, device)      # None unless critic.model is set
    values = critic.values(ids, attn, loss_mask, micros)             # [B, T-1] V(state before each action)
    adv, returns, value_mask = gae_advantages(rewards, verified, values, loss_mask, ...)  # per token
    terms = critic.step(batch, minibatch_rows)                       # one optimiser step on the value loss
    stats = value_stats(values, returns, value_mask)                # explained variance
    state = critic.state_dict()                                      # weights, optimiser, schedule, updates

The value model is a linear head ([H] -> 1) on a causal LM's final hidden states: a copy of the
policy (`critic.model: policy`; a LoRA policy's copy trains its own adapters, the base frozen) or
a separate model whose tokenizer is the policy's. Values sit at the learner's positions: position
t predicts token t+1, so its value is the state's before that token is chosen. The loss is PPO's
clipped value loss, 0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip the batch's value moved at
most `critic.value_clip`, a token mean over the minibatch (micro-batches weighted by their share
of its tokens). The critic steps once per policy minibatch, on the same rows; during
`critic.warmup_steps` it steps alone. Its whole state is in the learner's checkpoint state, so a
resumed run continues bit for bit.
"""

from __future__ import annotations

import copy

import torch

from postrl.algo.advantages import gae, whiten
from postrl.algo.losses import token_share
from postrl.config.schema import Config
from postrl.errors import ConfigError
from postrl.learner.precision import make_optimizer, warmup_schedule
from postrl.model.fastlm import hf_model
from postrl.model.logprobs import has_backbone, token_values


class ValueModel(torch.nn.Module):
    """A causal LM's backbone with a value head; the LM's own vocabulary head is never run."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        inner = hf_model(lm)
        emb = inner.get_input_embeddings().weight
        # zero: every value starts at 0 and the first steps fit the head before they move the backbone
        self.head = torch.nn.Linear(inner.config.hidden_size, 1, dtype=emb.dtype, device=emb.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.lm.eval()  # no dropout: the same values in the batch's pass and the loss's

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, needed: torch.Tensor, pack: bool) -> torch.Tensor:
        return token_values(self.lm, self.head, ids, attn, needed, pack=pack)

    def trained(self) -> list[torch.nn.Parameter]:
        """The head and the backbone's trainable weights (a LoRA copy: its adapters); the LM's
        vocabulary head is left out unless tied to the embeddings the backbone reads."""
        inner = hf_model(self.lm)
        head = inner.get_output_embeddings().weight
        tied = head is inner.get_input_embeddings().weight
        return [*self.head.parameters(),
                *(p for p in self.lm.parameters() if p.requires_grad and (tied or p is not head))]


class Critic:
    def __init__(self, model: ValueModel, cfg: Config):
        self.model, self.cfg = model, cfg.critic
        self.pack = cfg.train.pack_sequences
        self.max_grad_norm = cfg.train.max_grad_norm
        self.params = model.trained()
        self.opt = make_optimizer(self.params, lr=self.cfg.lr or cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.sched = warmup_schedule(self.opt, cfg.train.warmup_steps)
        self.updates = 0
        """Updates (steps of the run) the critic took part in; the first `critic.warmup_steps` are its alone."""

    @property
    def warming_up(self) -> bool:
        return self.updates < self.cfg.warmup_steps

    @torch.no_grad()
    def values(self, ids, attn, loss_mask, micros: list[torch.Tensor]) -> torch.Tensor:
        """[B, T-1] values on the action positions (0 elsewhere), one micro-batch at a time."""
        out = torch.zeros_like(loss_mask)
        for micro in micros:
            width = int(attn[micro].sum(-1).max())
            out[micro, : width - 1] = self.model(ids[micro, :width], attn[micro, :width],
                                                 loss_mask[micro, : width - 1], self.pack)
        return out

    def step(self, batch, mb: torch.Tensor, micros: list[torch.Tensor]) -> dict[str, float]:
        """One optimiser step on the clipped value loss of minibatch `mb` (cut into `micros`)."""
        self.opt.zero_grad(set_to_none=True)
        mask = batch.value_mask
        terms = {"loss": 0.0, "clip_frac": 0.0}
        for micro in micros:
            width = int(batch.attention_mask[micro].sum(-1).max())
            m = mask[micro, : width - 1]
            if not m.any():
                continue
            v = self.model(batch.input_ids[micro, :width], batch.attention_mask[micro, :width],
                           batch.loss_mask[micro, : width - 1], self.pack)
            loss, clip_frac = value_loss(v, batch.values[micro, : width - 1], batch.returns[micro, : width - 1], m,
                                         self.cfg.value_clip)
            weight = token_share(m, mask[mb])
            (weight * loss).backward()
            terms["loss"] += weight * float(loss.detach())
            terms["clip_frac"] += weight * clip_frac
        terms["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        self.opt.step()
        self.sched.step()
        return terms

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.updates = state["updates"]


def value_loss(v: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float) -> tuple[torch.Tensor, float]:
    """PPO's clipped value loss, a token mean over `mask`, and the share of tokens where the clipped
    term was the larger (its gradient stopped). v, old, returns, mask: [B, T]; clip 0 = unclipped.

    loss_t = 0.5 * max((v - R)^2, (old + clip(v - old, -c, c) - R)^2)
    """
    err = (v - returns) ** 2
    if clip > 0:
        clipped = (old + (v - old).clamp(-clip, clip) - returns) ** 2
        per_token = 0.5 * torch.maximum(err, clipped)
        frac = float(((clipped > err).float() * mask).sum() / mask.sum().clamp(min=1))
    else:
        per_token, frac = 0.5 * err, 0.0
    return (per_token * mask).sum() / mask.sum().clamp(min=1), frac


def gae_advantages(rewards: torch.Tensor, verified: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor,
                   token_penalty: torch.Tensor | None, gamma: float, lam: float,
                   scale: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token advantages, returns and the mask of tokens the critic learns from, all [B, T-1].
    rewards, verified: [B] (an unverified completion's reward
    filled in as for the group estimators); each reward is paid at its completion's last action
    token, `token_penalty` [B, T-1] (the KL when `rl.kl_in: reward`) taken at every token. An
    unverified completion gets zero advantage and no value target (no evidence either way).
    `scale`: whiten the advantages over the batch's verified tokens."""
    rows = torch.arange(len(rewards), device=values.device)
    token_rewards = torch.zeros_like(values)
    token_rewards[rows, last_action(loss_mask)] = rewards
    if token_penalty is not None:
        token_rewards = token_rewards - token_penalty
    adv, returns = gae(token_rewards, values, loss_mask, gamma, lam)
    value_mask = loss_mask * verified[:, None].float()
    adv = whiten(adv, value_mask) if scale else adv * value_mask
    return adv, returns, value_mask


def last_action(loss_mask: torch.Tensor) -> torch.Tensor:
    """[B] the last position on the mask of each row (0 for an empty row)."""
    cols = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    return ((loss_mask > 0) * cols).amax(-1)


def value_stats(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The batch's values against the returns they predict, over `mask`'s tokens: their means and the
    explained variance 1 - Var(R - V) / Var(R) (1: the values predict the returns; 0: no better than
    their mean; below 0: worse)."""
    m = mask > 0
    if not m.any():
        return {}
    v, r = values[m].double(), returns[m].double()
    var_r = r.var(unbiased=False)
    explained = float(1 - (r - v).var(unbiased=False) / var_r) if var_r > 0 else float("nan")
    return {"critic/value_mean": float(v.mean()), "critic/return_mean": float(r.mean()),
            "critic/explained_variance": explained}


def make_critic(cfg: Config, policy_model, policy_tok, load) -> Critic | None:
    """The run's critic (None without `critic.model`): a copy of the policy with a value head, or the
    named model's (`load(name)` -> (model, tokenizer)) on the policy's device. One-line errors for a
    model whose tokens or hidden states are not the policy's kind."""
    name = cfg.critic.model
    if not name:
        return None
    if name == "policy":
        lm = copy.deepcopy(policy_model)
    else:
        lm, tok = load(name)
        if tok.get_vocab() != policy_tok.get_vocab():
            raise ConfigError(f"config key 'critic.model' = {name!r}: its tokenizer is not model.name's "
                              f"({cfg.model.name!r}); a value model reads the policy's token ids")
        lm = lm.to(next(policy_model.parameters()).device)
        for p in lm.parameters():
            p.requires_grad_(True)
    if not has_backbone(lm):
        raise ConfigError(f"config key 'critic.model' = {name!r}: a value head reads a decoder's hidden states; "
                          f"{type(lm).__name__} is not a Llama-family model (llama, mistral, qwen2)")
    return Critic(ValueModel(lm), cfg)
