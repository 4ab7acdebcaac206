"""The train/inference mismatch and the off-policy weights of a batch, as metrics; the correction mode.

`Probe` keeps the learner's log-probs of the rows its update forwards first (on fresh rows, the
sampling version's: the mismatch at no extra pass); `offpolicy_stats` measures a stale batch's
behaviour-vs-proximal mismatch; `correction_mode` resolves `rl.rollout_correction.mode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postrl.algo.losses import kl_estimate, truncated_is_weight
from postrl.config.schema import Config
from postrl.errors import ConfigError
from postrl.records import Batch
from postrl.sampling.backends import SAMPLING_BACKENDS


def correction_mode(cfg: Config) -> str:
    """`rl.rollout_correction.mode` resolved: auto is seq_mask where the sampling backend's
    log-probs are not the learner's numerics (`BackendFacts.learner_numerics`), none where they are.
    A correction with `pipeline.proximal: behaviour` (no learner pass to weigh against) is a ConfigError."""
    mode = shown = cfg.rl.rollout_correction.mode
    if mode == "auto":
        mode = "none" if SAMPLING_BACKENDS.facts(cfg.rollout.backend).learner_numerics else "seq_mask"
        shown = f"auto ({mode} for rollout.backend {cfg.rollout.backend})"
    if mode != "none" and cfg.pipeline.proximal == "behaviour":
        raise ConfigError(f"config key 'rl.rollout_correction.mode' = {shown!r}: a correction needs the learner's "
                          f"log-probs, which pipeline.proximal: behaviour skips; set pipeline.proximal=trainer or "
                          f"rl.rollout_correction.mode=none")
    return mode


@dataclass
class Probe:
    """The learner's log-probs of the rows the update forwards first, before its first optimiser
    step: on fresh rows, the sampling version's, so the mismatch is measured with no extra pass."""

    logp: torch.Tensor
    """[B, T-1], written on the kept rows."""
    rows: torch.Tensor
    """[B] bool: the rows kept."""

    @classmethod
    def of(cls, batch: Batch) -> Probe:
        rows = torch.zeros(batch.input_ids.shape[0], dtype=torch.bool, device=batch.input_ids.device)
        return cls(torch.zeros_like(batch.old_logprobs), rows)

    def keep(self, rows: torch.Tensor, logp: torch.Tensor) -> None:
        self.logp[rows, : logp.shape[1]] = logp.detach()
        self.rows[rows] = True


def offpolicy_stats(batch: Batch, cap: float) -> dict[str, float]:
    """Behaviour-vs-proximal mismatch over a batch's completion tokens.

    mismatch_kl: k3 estimate of KL(pi_behav || pi_prox), sampled from pi_behav (the tokens drawn);
    is_weight_mean: mean truncated weight; is_truncated: share of tokens whose weight hit the cap."""
    if batch.prox_logprobs is None:
        return {}
    mask = batch.loss_mask  # [B, T-1]
    n = mask.sum().clamp(min=1)
    kl = kl_estimate(batch.old_logprobs, batch.prox_logprobs, "k3")  # log r = prox - behav
    raw = torch.exp(batch.prox_logprobs - batch.old_logprobs)
    w = truncated_is_weight(batch.prox_logprobs, batch.old_logprobs, cap)
    return {
        "offpolicy/mismatch_kl": float((kl * mask).sum() / n),
        "offpolicy/is_weight_mean": float((w * mask).sum() / n),
        "offpolicy/is_truncated": float(((raw > cap).float() * mask).sum() / n),
    }
