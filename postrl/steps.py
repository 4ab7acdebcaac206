"""The parts of one training step that are not model code: rewards, advantages, metrics, eval."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import torch

from postrl.algo.advantages import ADVANTAGES
from postrl.algo.losses import kl_estimate
from postrl.config import Config
from postrl.curriculum.dynamic import FillResult, fill_batch, passthrough
from postrl.evaluate import evaluate
from postrl.monitor.alerts import Alert
from postrl.policy.rollout import GenParams
from postrl.policy.update import UpdateStats
from postrl.records import Batch, Sample, Task
from postrl.rewards.composite import apply_terms
from postrl.seeding import step_generator
from postrl.tasks.base import Domain

if TYPE_CHECKING:
    from postrl.run import Run


def sample_temperatures(tasks: list[Task], n: int, cfg: Config) -> list[float]:
    """One temperature per sample: train.temperatures cycles within each group (multi-temperature
    sampling); otherwise the domain's own temperature, else train.temperature."""
    temps = []
    for task in tasks:
        own = cfg.domains[task.domain].temperature if task.domain in cfg.domains else 0.0
        for j in range(n):
            if cfg.train.temperatures:
                temps.append(cfg.train.temperatures[j % len(cfg.train.temperatures)])
            else:
                temps.append(own or cfg.train.temperature)
    return temps


def score_samples(samples: list[Sample], domains: dict[str, Domain], cfg: Config) -> None:
    """Grade every sample with its own domain (one batched call per domain), then apply the
    recipe's weighted reward terms for that domain."""
    by_domain: dict[str, list[Sample]] = {}
    for s in samples:
        by_domain.setdefault(s.task.domain, []).append(s)
    for name, group in by_domain.items():
        t0 = time.perf_counter()
        tasks, responses = [s.task for s in group], [s.response for s in group]
        domain = domains[name]
        scores = domain.score(tasks, responses)
        components = getattr(domain, "reward_components", None)  # names a verifier may return
        scores = apply_terms(cfg.domains[name].reward, tasks, responses, scores, components=components)
        share = (time.perf_counter() - t0) / len(group)
        for s, sc in zip(group, scores):
            s.score = sc
            s.timings["reward_s"] = share


def refill(run: Run, step: int, samples: list[Sample]) -> FillResult:
    """Dynamic sampling when `curriculum.dynamic_sampling` is on (see `postrl.curriculum.dynamic`);
    otherwise the batch as drawn. Extra rounds draw from the same curriculum as the first."""
    cfg, t = run.cfg, run.cfg.train
    if not cfg.curriculum.dynamic_sampling:
        return passthrough(samples, t.samples_per_prompt)

    def draw(k: int, round_: int) -> list[Sample]:
        tasks = run.sampler.next_batch(k, run.domain_weights, run.schedule.levels(), run.schedule.task_weight)
        temps = sample_temperatures(tasks, t.samples_per_prompt, cfg)
        gen = GenParams(t.max_new_tokens, t.temperature, t.top_p)
        # stream 0 is the step's first draw, 1 the update: extra rounds take 1 + round
        more = run.policy.sample(tasks, t.samples_per_prompt, gen, step_generator(cfg.seed, step, 1 + round_), temps)
        score_samples(more, run.domains, cfg)
        return more

    return fill_batch(samples, draw, t.samples_per_prompt, cfg.curriculum.max_extra_draws, t.minibatches)


def assign_advantages(samples: list[Sample], batch: Batch, cfg: Config, kl_coef: float) -> None:
    """Group-relative advantages into each sample and into `batch.advantages`.

    With `rl.kl_in: reward` each sample's reward is first reduced by kl_coef times its sequence
    KL to the reference (summed over tokens, measured on the behaviour log-probs), as in PPO-RLHF;
    the verifier's reward stays in `score.reward` and the penalty is logged as `kl_penalty`.
    """
    n = cfg.train.samples_per_prompt
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)  # [B]
    # A sample the verifier could not grade (timeout, error) is no evidence either way: it gets
    # its group's mean verified reward for the baseline and exactly zero advantage below.
    verified = torch.tensor([s.score is not None and s.score.status == "ok" for s in samples])
    rewards = fill_unverified(rewards.view(-1, n), verified.view(-1, n)).flatten()
    if cfg.rl.kl_in == "reward" and batch.ref_logprobs is not None:
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, cfg.rl.kl_estimator)  # [B, T-1]
        penalty = kl_coef * (kl * batch.loss_mask).sum(-1)  # [B]
        rewards = rewards - penalty
        for s, p in zip(samples, penalty.tolist()):
            s.score.components["kl_penalty"] = -p
    adv = ADVANTAGES.get(cfg.rl.advantage)(rewards.view(-1, n), scale_by_std=cfg.rl.scale_by_std).flatten()
    adv = torch.where(verified, adv, torch.zeros_like(adv))
    batch.advantages = adv
    for s, a in zip(samples, adv.tolist()):
        s.advantage = a


def fill_unverified(rewards: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """rewards, verified: [G, N]. Unverified entries take the mean of their group's verified ones (0 if none)."""
    v = verified.float()
    group_mean = (rewards * v).sum(-1, keepdim=True) / v.sum(-1, keepdim=True).clamp(min=1)  # [G, 1]
    return torch.where(verified, rewards, group_mean.expand_as(rewards))


def step_metrics(
    samples: list[Sample], stats: UpdateStats, seconds: tuple[float, float, float], kl_coef: float,
    domain_weights: dict[str, float],
) -> dict[str, float]:
    sample_s, reward_s, update_s = seconds
    n_tokens = sum(len(s.completion_ids) for s in samples)
    m = {
        "reward/mean": mean(s.reward for s in samples),
        "pass_rate": mean(bool(s.score and s.score.correct) for s in samples),
        "kl/mean": stats.kl_mean, "kl/max": stats.kl_max, "kl/coef": kl_coef,
        "entropy": stats.entropy, "clip_frac": stats.clip_frac,
        "response_len/mean": n_tokens / len(samples),
        "tokens_per_s": n_tokens / max(sample_s, 1e-9),
        "time/sample_s": sample_s, "time/reward_s": reward_s, "time/update_s": update_s,
        "loss": stats.loss, "pg_loss": stats.pg_loss, "grad_norm": stats.grad_norm, "lr": stats.lr,
        "verifier/unverified": mean(s.score is not None and s.score.status != "ok" for s in samples),
    }
    for name in sorted({s.task.domain for s in samples}):
        idx = [i for i, s in enumerate(samples) if s.task.domain == name]
        m[f"reward/{name}"] = mean(samples[i].reward for i in idx)
        m[f"pass_rate/{name}"] = mean(bool(samples[i].score and samples[i].score.correct) for i in idx)
        m[f"entropy/{name}"] = mean(stats.sample_entropy[i] for i in idx)
        m[f"batch/{name}"] = len(idx) / len(samples)
    total_w = sum(domain_weights.values())
    for name, w in domain_weights.items():
        m[f"curriculum/weight/{name}"] = w / total_w
    return m


AGGREGATES = {"mean": lambda values: mean(values), "min": lambda values: min(values, default=0.0)}
"""How `eval.best_aggregate` combines the domains' `eval.best_metric` into the best-checkpoint score."""


def run_eval(run: Run, step: int, alerts: list[Alert] | None = None) -> float:
    """Evaluate every domain's held-out split, write eval/step_N.json, check for seesaw
    regressions (recorded, and appended to `alerts` so the loop carries out their action);
    returns the best-checkpoint score."""
    cfg, e = run.cfg, run.cfg.eval
    result = evaluate(
        run.policy, run.domains, num_problems=e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
        temperature=e.temperature, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed,
    )
    (run.dir / "eval").mkdir(exist_ok=True)
    (run.dir / "eval" / f"step_{step}.json").write_text(json.dumps(result, indent=1))
    run.log(f"eval step {step}: " + "; ".join(f"{d}: {fmt_scores(r)}" for d, r in result.items()))
    scores = {d: float(r[e.best_metric]) for d, r in result.items() if e.best_metric in r}
    seesaw = seesaw_alerts(run.eval_best, scores, step, e.seesaw_drop, e.seesaw_action, e.best_metric)
    run.alert_log.record(seesaw)
    if alerts is not None:
        alerts.extend(seesaw)
    return AGGREGATES[e.best_aggregate](list(scores.values()))


def seesaw_alerts(
    best: dict[str, list], scores: dict[str, float], step: int, drop: float, action: str, metric: str = "pass@1",
) -> list[Alert]:
    """Alerts for domains more than `drop` below their best so far; updates `best` in place
    ({domain: [best value, step]}; it lives in the checkpoint). drop 0 = off, bests still kept.
    Joint training's seesaw: one domain improves while another quietly regresses."""
    out = []
    for domain, value in scores.items():
        prev, prev_step = best.get(domain, (None, None))
        if prev is None or value > prev:
            best[domain] = [value, step]
        elif drop > 0 and prev - value > drop:
            out.append(Alert(
                step, "seesaw",
                f"{domain} {metric} {value:.3f} is {prev - value:.3f} below its best {prev:.3f} (step {prev_step}); "
                f"threshold {drop}",
                action, {"value": value, "best": prev, "drop": prev - value, "best_step": float(prev_step)},
            ))
    return out


def mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0


def fmt_scores(r: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in r.items() if k == "greedy" or k.startswith("pass@"))
