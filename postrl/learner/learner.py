"""The update: clipped policy gradient with a KL penalty, over a step's samples.

    learner = Learner(policy, ref_model, cfg.train, cfg.rl, cfg.model)  # model: micro-batches, checkpointing, chunks
    batch = learner.build_batch(samples, kl_coef)      # tensors, reference log-probs, advantages
    stats = learner.update(batch, kl_coef, generator)  # ppo_epochs x minibatches optimiser steps
    state = learner.state_dict()                       # optimiser (bf16: its fp32 masters), LR schedule, version, critic
    learner.load_state_dict(state)                     # a checkpoint's (the model's weights are loaded first)
    learner.scale_lr(0.5)                              # rollback: the learning rate from here on

The learner owns its state: the optimiser, the LR schedule and the policy version (`policy.version`,
which counts its optimiser steps) are written by it alone, saved and restored through
`state_dict` / `load_state_dict`. With `train.learners` > 1 it is given its data-parallel ranks
when it is built (`postrl.learner.distributed.Ranks`) and hands them its weights and state when
theirs are behind (at the start, after a load or an LR change).

The learner owns each step's advantages: `build_batch` computes them from the samples' rewards
(`postrl.algo.advantages.group_advantages`) and writes each one into its sample (`advantage`,
and `kl_penalty` when the KL goes into the reward), so the batch and the stored rollout agree.
With a critic (`critic.model`, `rl.advantage: gae`; `postrl.learner.critic`) they are per token,
from the critic's values of the batch, the sample keeping their mean over its tokens; the critic
takes an optimiser step on each policy minibatch, and during `critic.warmup_steps` the policy's
passes run without a backward (its metrics measured, its weights unchanged).

Memory (long chains): a minibatch is cut into micro-batches by `model.micro_batch_size`
completions and/or `train.max_tokens_per_microbatch` tokens (whichever limit comes first); each
micro-batch's forward is padded or, with `train.pack_sequences`, one packed sequence; the
vocabulary head runs in chunks of `model.logits_chunk_mib` (`postrl.model.logprobs`). The batch
lives on the model's device; a bf16 model trains with float32 master weights
(`postrl.learner.precision`).

The train/inference mismatch (`postrl.algo.correction`) is measured every step on the fresh rows
(sampled at the learner's version when the batch is built) where the learner has its own
log-probs at no extra cost: every fresh row when a rollout correction runs the proximal pass on
all rows, else the fresh rows of the first minibatch of the first epoch, from the loss's own
forward before any optimiser step (with data-parallel ranks: rank 0's share of them). With
`rl.rollout_correction.mode: none` no pass is added and the loss is unchanged bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from postrl.algo.advantages import ADVANTAGES, fill_unverified, group_advantages
from postrl.algo.correction import CORRECTIONS, correction_stats, mismatch_stats
from postrl.algo.losses import (
    LOSS_AGGREGATIONS,
    LOSSES,
    Aggregation,
    aggregate,
    kl_estimate,
    truncated_is_weight,
)
from postrl.algo.overlong import soft_overlong_penalty
from postrl.config.schema import ModelConfig, RLConfig, TrainConfig
from postrl.errors import UserError
from postrl.learner import sharded
from postrl.learner.batch import (
    check_whole_groups,
    completion_length,
    completion_rows,
    logprobs_into,
    micro_batches,
    padded_rows,
)
from postrl.learner.critic import Critic, gae_advantages, value_stats
from postrl.learner.offpolicy import Probe, offpolicy_stats
from postrl.learner.precision import make_optimizer, warmup_schedule
from postrl.learner.ranks import LearnerRanks
from postrl.model.device import model_device
from postrl.model.fastlm import FastLM, compile_problem
from postrl.model.logprobs import hf_decoder_and_head, token_logprobs
from postrl.records import Batch, Sample
from postrl.sampling.policy import Policy


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
    memory: dict[str, float] = field(default_factory=dict)
    """`learner/state_mib` and `learner/peak_mib` (`postrl.learner.sharded.memory_mib`), the largest
    of the ranks'."""
    offpolicy: dict[str, float] = field(default_factory=dict)
    """Off-policy metrics: `mismatch/*` every step (`mismatch_stats`), `offpolicy/*` on a stale
    batch with no rollout correction, `rollout_correction/*` with one."""
    critic: dict[str, float] = field(default_factory=dict)
    """`critic/*` with a critic (`Learner._critic_stats`); empty without one."""


class Learner:
    def __init__(self, policy: Policy, ref_model, train: TrainConfig, rl: RLConfig,
                 model_cfg: ModelConfig | None = None, is_cap: float = 2.0, proximal: str = "trainer",
                 ranks: LearnerRanks | None = None, correction: str = "none", critic: Critic | None = None):
        self.policy, self.ref_model, self.train_cfg, self.rl = policy, ref_model, train, rl
        self.critic = critic
        """PPO's value model and its optimiser (`critic.model`), or None."""
        self.is_cap = is_cap
        """Truncation of the behaviour->proximal importance weight on stale batches."""
        self.proximal = proximal
        """`pipeline.proximal`: trainer (decoupled PPO: an extra pass on stale rows) or behaviour."""
        self.correction = correction
        """`rl.rollout_correction.mode` resolved (`correction_mode`): none, or a `CORRECTIONS` name,
        whose weight on pi_prox / pi_behav replaces decoupled PPO's on every row."""
        model_cfg = model_cfg or ModelConfig()
        self.micro_batch_size = model_cfg.micro_batch_size
        self.chunk_mib = model_cfg.logits_chunk_mib
        self.device = model_device(policy.model)
        self.forward_model = policy.model
        """What `build_batch`'s passes call: the sampler's model (rank 0's full one when sharded)."""
        if model_cfg.gradient_checkpointing:
            # non-reentrant: with frozen embeddings (LoRA) the reentrant variant sees inputs that
            # need no gradient and silently drops the gradients of every checkpointed layer
            enable = getattr(policy.model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.forward_model = _ModuleForward(policy.model)
        self.ranks = ranks
        """With `train.learners` > 1 its ranks (`LearnerRanks`: `postrl.learner.distributed.Ranks`): this rank's share, the reductions."""
        self.sharded = ranks is not None and ranks.sharded
        self.model = policy.model
        """The model the update trains: the policy's, or with `train.shard: fsdp` its sharded copy
        (rank 0: a copy, its sampler keeps the full model; the other ranks: the model itself)."""
        self.update_model = self.forward_model
        """What the loss calls: the sharded model through its own forward (FSDP2 gathers in its hooks)."""
        self.low_precision = next(policy.model.parameters()).dtype != torch.float32
        """bf16 or fp16 weights: the optimiser keeps float32 masters (sharded: the shards are them)."""
        if self.sharded:
            self.model = sharded.shard(policy.model, self.device, copy_first=ranks.rank == 0)
            self.update_model = _ModuleForward(self.model, split=False)
        if train.compile:
            check_compile(self.update_model, self.device)
        self.loss_fn = LOSSES.get(rl.loss)
        self.share = LOSS_AGGREGATIONS.facts(rl.loss_agg, key="rl.loss_agg").share
        """`rl.loss_agg`'s micro-batch weight rule (`AggregationFacts.share`): weights accumulated gradients."""
        self.agg = Aggregation(rl.loss_agg, budget=rl.loss_agg_budget or train.max_new_tokens)
        """`rl.loss_agg` with the generation budget a budget-normalised one divides by."""
        trained = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.trained = [n for n, _ in trained]
        """Names of the weights the update changes (sharded: what it gathers for the sampler)."""
        self.opt = make_optimizer([p for _, p in trained], lr=train.lr, weight_decay=train.weight_decay)  # bf16: fp32 masters
        self.sched = warmup_schedule(self.opt, train.warmup_steps)
        self._ranks_behind = False
        """Rank 0: the other ranks lack this rank's weights or state; they get them with the next update."""
        self._state_changed()  # LoRA's adapters start random and each rank made its own optimiser
        if self.sharded and ranks.rank == 0:  # LoRA's random adapters: rank 0's, in every rank's shards
            self.ranks.send_state(self.policy.model.state_dict(), None)

    def state_dict(self) -> dict:
        """What a checkpoint holds of the learner: the optimiser's state (with bf16 models its
        float32 master weights, `postrl.learner.precision`), the LR schedule's, and the policy
        version. The model's weights are not in it: a checkpoint keeps them as a model directory.
        Sharded: the same, gathered whole from the ranks (`Ranks.gather_state`)."""
        if self.sharded and self.ranks.rank == 0:
            self.ranks.gather_state()
        optimizer = self.full_optimizer_state() if self.sharded else self.opt.state_dict()
        state = {"optimizer": optimizer, "scheduler": self.sched.state_dict(), "policy_version": self.policy.version}
        return state | ({"critic": self.critic.state_dict()} if self.critic is not None else {})

    def full_optimizer_state(self) -> dict:
        """Sharded, on every rank at once (a collective): the optimiser's state gathered whole."""
        return sharded.full_optimizer_state(self.opt, masters=self.low_precision)

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (`state_dict`'s), after the model's weights were loaded (bf16: the
        optimiser's master weights are then written over them). The other data-parallel ranks get it
        with the next update; sharded ranks at once, with rank 0's weights, which every rank (rank 0
        too) loads into its shards before the optimiser's state."""
        if self.sharded:
            if self.ranks.rank == 0:
                weights = self.policy.model.state_dict()
                self.ranks.send_state(weights, state)
                sharded.load_weights(self.model, weights)
            sharded.load_optimizer_state(self.opt, state["optimizer"])
        else:
            self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.policy.version = state["policy_version"]
        if self.critic is not None:
            if "critic" not in state:
                raise UserError("this checkpoint was written without a critic (critic.model was not set); "
                                "resume it with the recipe it was written by")
            self.critic.load_state_dict(state["critic"])
        self._state_changed()

    def scale_lr(self, factor: float) -> None:
        """The learning rate times `factor` from here on, warm-up included: the optimiser's current
        rates and the schedule's base rates (rollback's `monitor.rollback_lr_factor`)."""
        for group in self.opt.param_groups:
            group["lr"] *= factor
        self.sched.base_lrs = [lr * factor for lr in self.sched.base_lrs]
        if self.sharded and self.ranks.rank == 0:
            self.ranks.scale_lr(factor)
        self._state_changed()

    def _state_changed(self) -> None:
        """The one place that marks the other ranks behind (rank 0 of several replicated ones;
        nothing otherwise: sharded ranks are sent every change when it is made)."""
        self._ranks_behind = self.ranks is not None and self.ranks.rank == 0 and not self.sharded

    def load_rank_state(self, weights: dict, state: dict | None) -> None:
        """Ranks 1..N-1: rank 0's model weights and `state_dict` (None: only the weights), as `Ranks`
        delivers them."""
        if self.sharded:
            sharded.load_weights(self.model, weights)
        else:
            self.policy.model.load_state_dict(weights)
        if state is not None:
            self.load_state_dict(state)

    def dead_ranks(self) -> list[tuple[int, int | None]]:
        """(rank, exit code) of every data-parallel rank that is not running; [] with one learner."""
        return self.ranks.dead() if self.ranks is not None else []

    def build_batch(self, samples: list[Sample], kl_coef: float) -> Batch:
        """Right-pad prompt+completion rows (position t of the masks predicts token t+1), compute
        the reference log-probs once (or take those a sampler process computed,
        `Sample.ref_logprobs`), and the advantages. `samples`: whole groups of
        `train.samples_per_prompt`, contiguous (a ValueError otherwise)."""
        check_whole_groups([s.group for s in samples], self.train_cfg.samples_per_prompt)
        ids, attn, loss_mask, old = (t.to(self.device) for t in padded_rows(samples, self.policy.tok.pad_token_id))
        temps = torch.tensor([s.temperature for s in samples], device=self.device)
        ref = None
        if self.ref_model is not None and self.rl.kl_coef > 0:
            if all(s.ref_logprobs is not None for s in samples):
                ref = completion_rows(samples, [s.ref_logprobs for s in samples], old.shape[1]).to(self.device)
            else:
                ref = self._logprobs(self.ref_model, torch.arange(len(samples), device=self.device), ids, attn,
                                     loss_mask, temps, out=torch.zeros_like(old))
        values = None
        if self.critic is not None:
            values = self.critic.values(ids, attn, loss_mask, self._micro_batches(
                torch.arange(len(samples), device=self.device), attn))
        adv, returns, value_mask = self._advantages(samples, old, ref, loss_mask, kl_coef, values)
        fresh = torch.tensor([s.policy_version == self.policy.version for s in samples], device=self.device)
        prox = self._proximal_logprobs(fresh, ids, attn, loss_mask, old, temps)
        return Batch(ids, attn, loss_mask, old, ref, adv, temps, prox, fresh, values, returns, value_mask)

    def _advantages(self, samples, old, ref, loss_mask, kl_coef: float, values: torch.Tensor | None):
        """(advantages, returns, value mask): [B] group-relative advantages, written into the
        samples too, and None, None; with a critic's `values` GAE's per-token ones [B, T-1], the
        returns and the tokens the critic learns from (`gae_advantages`), each sample keeping the
        mean of its own. With `rl.kl_in: reward` each reward is first reduced by kl_coef times the
        sequence KL to the reference (summed over tokens, on the behaviour log-probs), as in
        PPO-RLHF (with GAE: each token's at that token); with `rl.overlong_buffer` by DAPO's soft
        overlong penalty. The [G, N] view needs whole groups, each contiguous: `build_batch`
        checked them."""
        n = self.train_cfg.samples_per_prompt
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32, device=self.device).view(-1, n)  # [G, N]
        verified = torch.tensor([s.score is not None and s.score.status == "ok" for s in samples],
                                device=self.device).view(-1, n)
        kl_penalty = token_kl = overlong = None
        if self.rl.kl_in == "reward" and ref is not None:
            kl = kl_estimate(old, ref, self.rl.kl_estimator) * loss_mask  # [B, T-1]
            kl_penalty = kl_coef * kl.sum(-1)  # [B]
            token_kl = kl_coef * kl if values is not None else None
        if self.rl.overlong_buffer:
            lengths = torch.tensor([completion_length(s) for s in samples], device=self.device)
            overlong = -self.rl.overlong_penalty * soft_overlong_penalty(lengths, self.train_cfg.max_new_tokens,
                                                                         self.rl.overlong_buffer)  # [B], >= 0
        returns = value_mask = None
        if values is None:
            penalty = kl_penalty
            if overlong is not None:
                penalty = overlong if penalty is None else penalty + overlong
            estimator = ADVANTAGES.get(self.rl.advantage, key="rl.advantage")
            adv = per_sample = group_advantages(estimator, rewards, verified, penalty, self.rl.scale_by_std)  # [B]
        else:  # GAE: the reward less the overlong penalty at the last token, the KL at each token
            shaped = fill_unverified(rewards, verified).flatten()
            if overlong is not None:
                shaped = shaped - overlong
            adv, returns, value_mask = gae_advantages(shaped, verified.flatten(), values, loss_mask, token_kl,
                                                      self.rl.gamma, self.rl.lam, self.rl.scale_by_std)
            per_sample = (adv * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
        for i, (s, a) in enumerate(zip(samples, per_sample.tolist())):
            s.advantage = a
            s.kl_penalty = None if kl_penalty is None else float(kl_penalty[i])
        return adv, returns, value_mask

    @torch.no_grad()
    def _proximal_logprobs(self, fresh, ids, attn, loss_mask, old, temps) -> torch.Tensor | None:
        """The trainer's own log-probs on rows sampled by older weights (asynchronous pipeline);
        None when every row is on-policy, so the synchronous loss is unchanged bit for bit, and
        with `pipeline.proximal: behaviour` (plain PPO around the sampling weights).
        Fresh rows keep their behaviour log-probs: there the two policies are the same weights,
        and the sampler's numerics define the trust region as in the synchronous loop.
        With a rollout correction every row gets them: on fresh rows they are the learner's
        numerics at the sampling version, which the correction weighs against the sampler's."""
        if self.proximal == "behaviour":  # correction_mode refuses it with a correction
            return None
        rows = torch.ones_like(fresh) if self.correction != "none" else ~fresh
        if not rows.any():
            return None
        return self._logprobs(self.forward_model, rows.nonzero().flatten(), ids, attn, loss_mask, temps,
                              out=old.clone())

    def _logprobs(self, model, rows, ids, attn, loss_mask, temps, out: torch.Tensor) -> torch.Tensor:
        return logprobs_into(model, self._micro_batches(rows, attn), ids, attn, loss_mask, temps, out,
                             pack=self.train_cfg.pack_sequences, chunk_mib=self.chunk_mib)

    def update(self, batch: Batch, kl_coef: float, generator: torch.Generator) -> UpdateStats:
        """`ppo_epochs` x `minibatches` optimiser steps on `batch`; with data-parallel ranks
        (`postrl.learner.distributed`) each takes its share of every minibatch, the same call on each."""
        if self.ranks is not None:
            if self._ranks_behind:  # sent before this update changes the optimiser's state in place
                self.ranks.send_state(self.policy.model.state_dict(), self.state_dict())
                self._ranks_behind = False
            self.ranks.begin(batch, kl_coef, generator)
        try:
            return self._update(batch, kl_coef, generator)
        finally:
            if self.ranks is not None:
                self.ranks.end()

    def _update(self, batch: Batch, kl_coef: float, generator: torch.Generator) -> UpdateStats:
        model = self.model
        sample_entropy = torch.zeros(batch.input_ids.shape[0], device=self.device)
        model.train()
        size = batch.input_ids.shape[0] // self.train_cfg.minibatches
        totals: dict[str, float] = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "ent": 0.0, "clip": 0.0, "gn": 0.0}
        kl_max, steps, passes = 0.0, 0, 0
        critic_terms: dict[str, float] = {}
        frozen = self.critic is not None and self.critic.warming_up  # critic.warmup_steps: the policy waits
        probe = Probe.of(batch) if self.correction == "none" else None  # a correction measured in build_batch
        for epoch in range(self.train_cfg.ppo_epochs):
            # drawn on the generator's device (the CPU's seeded stream): the same order on every device
            order = torch.randperm(batch.input_ids.shape[0], generator=generator, device=generator.device)
            order = order.to(self.device)
            for start in range(0, len(order), size):
                mb = order[start : start + size]
                if self.critic is not None:
                    for key, value in self.critic.step(batch, mb, self._micro_batches(mb, batch.attention_mask)).items():
                        critic_terms[key] = critic_terms.get(key, 0.0) + value
                self.opt.zero_grad(set_to_none=True)
                with torch.set_grad_enabled(not frozen):
                    mb_max = self._accumulate(batch, mb, kl_coef, totals, sample_entropy if epoch == 0 else None,
                                              probe if passes == 0 else None, backward=not frozen)
                kl_max = max(kl_max, mb_max)
                passes += 1
                if frozen:  # measured, not stepped
                    continue
                if self.ranks is not None and not self.sharded:  # sharded: FSDP2 summed them in the backward
                    self.ranks.sum_grads([p for p in model.parameters() if p.requires_grad])
                gn = sharded.full(torch.nn.utils.clip_grad_norm_(model.parameters(), self.train_cfg.max_grad_norm))
                self.opt.step()
                self.sched.step()
                self.policy.version += 1
                steps += 1
                totals["gn"] += float(gn)
        model.eval()
        if self.critic is not None:
            self.critic.updates += 1
        memory = sharded.memory_mib(model, self.opt)
        if self.ranks is not None:
            kl_max = self.ranks.sum_stats(totals, kl_max, sample_entropy, memory)
        if self.sharded:  # the update's weights, gathered once, into rank 0's sampler
            self._write_back(sharded.gather(model, self.trained))
        elif self.ranks is not None:
            self.ranks.check_same([p for p in model.parameters() if p.requires_grad])
        return UpdateStats(
            loss=totals["loss"] / passes, pg_loss=totals["pg"] / passes, kl_mean=totals["kl"] / passes, kl_max=kl_max,
            entropy=totals["ent"] / passes, clip_frac=totals["clip"] / passes, grad_norm=totals["gn"] / max(steps, 1),
            lr=self.sched.get_last_lr()[0], optimizer_steps=steps, sample_entropy=sample_entropy.tolist(),
            memory=memory, offpolicy=self._offpolicy_stats(batch, probe),
            critic=self._critic_stats(batch, critic_terms, passes, frozen),
        )

    def _critic_stats(self, batch: Batch, terms: dict[str, float], steps: int, frozen: bool) -> dict[str, float]:
        """`critic/*` metrics of this update: the means over its optimiser steps, the batch's values
        against their returns (`value_stats`), its learning rate, and whether the policy waited for
        it (`critic/warmup`, 1 during critic.warmup_steps)."""
        if self.critic is None:
            return {}
        return ({f"critic/{key}": value / steps for key, value in terms.items()}
                | value_stats(batch.values, batch.returns, batch.value_mask)
                | {"critic/lr": self.critic.sched.get_last_lr()[0], "critic/warmup": float(frozen)})

    @torch.no_grad()
    def _write_back(self, weights: dict[str, torch.Tensor]) -> None:
        """Rank 0: the sharded update's trained weights, whole, into the sampler's model (rounded to
        its dtype); the other ranks have nothing to write them to."""
        if self.ranks.rank != 0:
            return
        params = dict(self.policy.model.named_parameters())
        for name, value in weights.items():
            params[name].copy_(value)

    def _offpolicy_stats(self, batch: Batch, probe: Probe | None) -> dict[str, float]:
        """The mismatch on the fresh rows the learner forwarded at their sampling version: with a
        correction, every fresh row (its proximal pass); without, the fresh rows of this rank's
        share of the first minibatch (the loss's own forward, before the first optimiser step).
        Then the correction's weights, or decoupled PPO's on a stale batch."""
        out: dict[str, float] = {}
        if batch.fresh is not None:  # None: a batch made elsewhere, its rows' versions unknown
            learner = batch.prox_logprobs if probe is None else probe.logp
            rows = batch.fresh if probe is None else probe.rows & batch.fresh
            out = mismatch_stats(learner[rows], batch.old_logprobs[rows], batch.loss_mask[rows])
        if self.correction == "none":
            return out | offpolicy_stats(batch, self.is_cap)
        return out | correction_stats(self._correct(batch.prox_logprobs, batch.old_logprobs, batch.loss_mask),
                                      batch.loss_mask)

    def _correct(self, prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor):
        rc = self.rl.rollout_correction
        return CORRECTIONS.get(self.correction)(prox - behav, mask, rc.cap, rc.low)

    def _accumulate(self, batch: Batch, mb: torch.Tensor, kl_coef: float, totals: dict[str, float],
                    sample_entropy: torch.Tensor | None, probe: Probe | None, backward: bool = True) -> float:
        """The minibatch `mb`'s gradient (this rank's share of it, with data-parallel ranks) and
        weighted loss terms added to `totals`; returns its largest token KL. Gradient accumulation:
        each micro-batch's loss is weighted by its share of the minibatch's aggregation
        denominator, so the summed gradient is the minibatch's. `backward` False: the terms only."""
        rows, kl_max = mb if self.ranks is None else self.ranks.share(mb), 0.0
        micros = self._micro_batches(rows, batch.attention_mask) if len(rows) else []
        if self.sharded:  # FSDP2 gathers weights in each pass: every rank runs as many, some with weight 0
            micros += [None] * (self.ranks.most(len(micros)) - len(micros))
        for micro in micros:
            if micro is None:
                loss, _ = self._micro_loss(batch, mb[:1], kl_coef, None)
                (0.0 * loss).backward()
                continue
            weight = self.share(batch.loss_mask[micro], batch.loss_mask[mb])
            loss, terms = self._micro_loss(batch, micro, kl_coef, sample_entropy, probe)
            if backward:
                (weight * loss).backward()
            for key in ("loss", "pg", "kl", "ent", "clip"):
                totals[key] += weight * terms[key]
            kl_max = max(kl_max, terms["kl_max"])
        return kl_max

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()

    def _micro_batches(self, mb: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        return micro_batches(mb, attention_mask, self.micro_batch_size, self.train_cfg.max_tokens_per_microbatch,
                             self.train_cfg.pack_sequences)

    def _micro_loss(self, batch: Batch, rows: torch.Tensor, kl_coef: float, sample_entropy,
                    probe: Probe | None = None):
        """(loss, its terms as floats) of `rows`, aggregated over these rows only (the caller
        reweights them); `probe` keeps the learner's log-probs of them."""
        rl = self.rl
        # rows are right-padded: columns past the longest real row are skipped entirely
        width = int(batch.attention_mask[rows].sum(-1).max())
        ids, attn = batch.input_ids[rows, :width], batch.attention_mask[rows, :width]
        mask, old = batch.loss_mask[rows, : width - 1], batch.old_logprobs[rows, : width - 1]
        logp, ent = token_logprobs(
            self.update_model, ids, attn, batch.temperatures[rows], with_entropy=True,
            entropy_grad=rl.entropy_coef > 0, needed=mask, pack=self.train_cfg.pack_sequences,
            chunk_mib=self.chunk_mib, compiled="inductor" if self.train_cfg.compile else None,
        )
        if probe is not None:
            probe.keep(rows, logp)
        weight = None
        if batch.prox_logprobs is not None:  # trust region around the proximal policy, times a weight
            behav, old = old, batch.prox_logprobs[rows, : width - 1]
            if self.correction == "none":  # decoupled PPO: stale rows; on fresh ones prox = behav, weight 1
                weight = truncated_is_weight(old, behav, self.is_cap)  # [b, t]
            else:  # the rollout correction's transform of pi_prox / pi_behav, on every row
                weight = self._correct(old, behav, mask).weight  # [b, t]
        adv = batch.advantages[rows]
        if adv.dim() == 2:  # one a token (GAE)
            adv = adv[:, : width - 1]
        pg, st = self.loss_fn(logp, old, adv, mask, rl.clip_low, rl.clip_high, self.agg, is_weight=weight)
        loss, ent_mean = pg, aggregate(ent, mask, self.agg)
        if sample_entropy is not None:
            sample_entropy[rows] = ((ent * mask).sum(-1) / mask.sum(-1).clamp(min=1)).detach()
        kl_mean, kl_max = torch.zeros((), device=self.device), 0.0
        if batch.ref_logprobs is not None:
            kl = kl_estimate(logp, batch.ref_logprobs[rows, : width - 1], rl.kl_estimator)  # [b, t]
            kl_mean = aggregate(kl, mask, self.agg)
            if rl.kl_in == "loss":
                loss = loss + kl_coef * kl_mean
            kl_max = float((kl.detach() * mask).max())
        if rl.entropy_coef > 0:
            loss = loss - rl.entropy_coef * ent_mean
        return loss, {"loss": float(loss.detach()), "pg": float(pg.detach()), "kl": float(kl_mean.detach()),
                      "ent": float(ent_mean.detach()), "clip": st.clip_frac, "kl_max": kl_max}


def check_compile(model, device: torch.device) -> None:
    """`train.compile`: a one-line error unless torch.compile can compile here and the update runs
    the fused forward it compiles. Only the update's forward and backward are compiled: the no-grad
    passes (reference, proximal) stay eager, as a sampler process computes the reference."""
    problem = compile_problem(device)
    if problem is None and FastLM.wrap(model) is None:
        problem = ("it compiles the fused forward (FastLM), which this update does not run (gradient "
                   "checkpointing, train.shard fsdp, or an architecture or adapter it does not cover)")
    if problem is not None:
        raise UserError(f"train.compile: {problem}; set train.compile false")


class _ModuleForward:
    """Calls the model's own forward and hides the model from fused fast paths (FastLM), which
    run the layers' weights directly and so would bypass Hugging Face's gradient checkpointing,
    or FSDP2's gathers. `split=False` (a sharded model): no decoder/head split either, whose
    direct call of the decoder would skip the root unit's gather of the embeddings and head."""

    def __init__(self, model, split: bool = True):
        self._model, self._split = model, split

    def __call__(self, **inputs):
        return self._model(**inputs)

    def decoder_and_head(self):
        """The model's own decoder (checkpointed layers) and head, for the chunked log-probs."""
        return hf_decoder_and_head(self._model) if self._split else None
