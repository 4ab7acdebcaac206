"""The update: clipped policy gradient with a KL penalty, over a step's samples.

    learner = Learner(policy, ref_model, cfg.train, cfg.rl)
    batch = learner.build_batch(samples)               # tensors; reference log-probs computed once here
    batch.advantages = ...                             # [B], from the step's rewards
    stats = learner.update(batch, kl_coef, generator)  # ppo_epochs x minibatches optimiser steps
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.algo.losses import LOSSES, aggregate, kl_estimate
from postrl.config import RLConfig, TrainConfig
from postrl.policy.logprobs import token_logprobs
from postrl.policy.policy import Policy
from postrl.records import Batch, Sample


@dataclass
class UpdateStats:
    loss: float
    pg_loss: float
    kl_mean: float
    kl_max: float
    entropy: float
    clip_frac: float
    grad_norm: float
    lr: float
    optimizer_steps: int
    sample_entropy: list[float]
    """Mean token entropy of each completion, from the first pass (for per-domain metrics)."""


class Learner:
    def __init__(self, policy: Policy, ref_model, train: TrainConfig, rl: RLConfig):
        self.policy, self.ref_model, self.train_cfg, self.rl = policy, ref_model, train, rl
        self.loss_fn = LOSSES.get(rl.loss)
        params = [p for p in policy.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
        warmup = max(1, train.warmup_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warmup))

    def build_batch(self, samples: list[Sample]) -> Batch:
        """Right-pad prompt+completion rows; position t of the masks predicts token t+1."""
        pad = self.policy.tok.pad_token_id
        rows = [s.prompt_ids + s.completion_ids for s in samples]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        loss_mask = torch.zeros((len(rows), width - 1))
        old = torch.zeros((len(rows), width - 1))
        for i, (s, row) in enumerate(zip(samples, rows)):
            ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = 1
            start, n = len(s.prompt_ids) - 1, len(s.completion_ids)
            loss_mask[i, start : start + n] = 1.0
            old[i, start : start + n] = torch.tensor(s.logprobs)
        temps = torch.tensor([s.temperature for s in samples])
        ref = None
        if self.ref_model is not None and self.rl.kl_coef > 0:
            with torch.no_grad():
                ref, _ = token_logprobs(self.ref_model, ids, attn, temps)
        adv = torch.zeros(len(samples))  # filled in from the rewards by the loop
        return Batch(ids, attn, loss_mask, old, ref, adv, temps)

    def update(self, batch: Batch, kl_coef: float, generator: torch.Generator) -> UpdateStats:
        model, rl = self.policy.model, self.rl
        kl_in_loss = rl.kl_in == "loss"
        sample_entropy = torch.zeros(batch.input_ids.shape[0])
        model.train()
        size = batch.input_ids.shape[0] // self.train_cfg.minibatches
        totals: dict[str, float] = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "ent": 0.0, "clip": 0.0, "gn": 0.0}
        kl_max, steps = 0.0, 0
        for epoch in range(self.train_cfg.ppo_epochs):
            order = torch.randperm(batch.input_ids.shape[0], generator=generator)
            for start in range(0, len(order), size):
                mb = order[start : start + size]
                # rows are right-padded: columns past the longest real row are skipped entirely
                width = int(batch.attention_mask[mb].sum(-1).max())
                ids, attn = batch.input_ids[mb, :width], batch.attention_mask[mb, :width]
                mask, old = batch.loss_mask[mb, : width - 1], batch.old_logprobs[mb, : width - 1]
                logp, ent = token_logprobs(
                    model, ids, attn, batch.temperatures[mb], with_entropy=True, entropy_grad=rl.entropy_coef > 0
                )
                pg, st = self.loss_fn(logp, old, batch.advantages[mb], mask, rl.clip_low, rl.clip_high, rl.loss_agg)
                loss, ent_mean = pg, aggregate(ent, mask, rl.loss_agg)
                if epoch == 0:
                    sample_entropy[mb] = ((ent * mask).sum(-1) / mask.sum(-1).clamp(min=1)).detach()
                kl_mean = torch.zeros(())
                if batch.ref_logprobs is not None:
                    kl = kl_estimate(logp, batch.ref_logprobs[mb, : width - 1], rl.kl_estimator)  # [b, t]
                    kl_mean = aggregate(kl, mask, rl.loss_agg)
                    if kl_in_loss:
                        loss = loss + kl_coef * kl_mean
                    kl_max = max(kl_max, float((kl.detach() * mask).max()))
                if rl.entropy_coef > 0:
                    loss = loss - rl.entropy_coef * ent_mean
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), self.train_cfg.max_grad_norm)
                self.opt.step()
                self.sched.step()
                self.policy.version += 1
                steps += 1
                for key, v in (("loss", loss), ("pg", pg), ("kl", kl_mean), ("ent", ent_mean), ("gn", gn)):
                    totals[key] += float(v.detach())
                totals["clip"] += st.clip_frac
        model.eval()
        return UpdateStats(
            loss=totals["loss"] / steps, pg_loss=totals["pg"] / steps, kl_mean=totals["kl"] / steps, kl_max=kl_max,
            entropy=totals["ent"] / steps, clip_frac=totals["clip"] / steps, grad_norm=totals["gn"] / steps,
            lr=self.sched.get_last_lr()[0], optimizer_steps=steps, sample_entropy=sample_entropy.tolist(),
        )
