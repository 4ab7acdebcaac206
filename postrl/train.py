"""The training loop: group-relative policy optimisation with verifiable rewards (GRPO family).

Per step:
  1. draw `prompts_per_step` tasks from the domain mixture (weights from the schedule);
  2. sample `samples_per_prompt` completions for each, recording behaviour log-probs;
  3. score every completion with its domain's verifier (plus any weighted reward terms);
  4. advantages relative to the other completions of the same prompt;
  5. `ppo_epochs` x `minibatches` clipped policy-gradient steps with a KL penalty to the frozen
     initial policy (the reference);
  6. update the domain weights from the step's metrics.

Departures from the GRPO paper (Shao et al., 2024), each a config switch:
  - token-mean loss aggregation (DAPO) instead of per-sequence means (`rl.loss_agg`);
  - separate lower/upper clip ranges, clip-higher (DAPO) (`rl.clip_low`, `rl.clip_high`);
  - scaling advantages by the group std is optional (Dr. GRPO) (`rl.scale_by_std`);
  - the sampler's behaviour log-probs are reused as the "old" log-probs: no extra forward pass,
    and the first minibatch is exactly on-policy;
  - the KL term (k3 by default, as in GRPO) is skipped entirely when `rl.kl_coef` is 0.
"""

from __future__ import annotations

import copy
import json
import random
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from postrl.algo.advantages import ADVANTAGES
from postrl.config import Config, save_config
from postrl.curriculum.sampler import TaskSampler
from postrl.errors import UserError
from postrl.evaluate import evaluate
from postrl.monitor.sinks import make_sinks
from postrl.policy.model import load_model
from postrl.policy.policy import Policy
from postrl.policy.rollout import GenParams
from postrl.policy.update import Learner, UpdateStats
from postrl.records import Sample
from postrl.tasks.base import Domain, UnknownDomainError, make_domain
from postrl.ui import Progress


def train(cfg: Config, log=print) -> Path:
    """Run RL post-training as configured; returns the run directory (trained model in final/)."""
    seed_everything(cfg.seed)
    run_dir = make_run_dir(cfg)
    save_config(cfg, run_dir / "config.yaml")
    domains = build_domains(cfg)
    model, tok = load_model(cfg.model.name, cfg.model.dtype, log=log)
    policy = Policy(model, tok)
    ref_model = frozen_copy(model) if cfg.rl.kl_coef > 0 else None
    learner = Learner(policy, ref_model, cfg.train, cfg.rl)
    sampler = TaskSampler(domains, cfg.seed)
    domain_weights = {name: d.weight for name, d in cfg.domains.items()}
    gen = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
    sinks = make_sinks(run_dir, ["tensorboard"], run_name=cfg.run.name)
    log(f"run directory: {run_dir}")

    with Progress(cfg.train.total_steps, enabled=cfg.run.progress) as bar:
        for step in range(cfg.train.total_steps):
            t0 = time.perf_counter()
            tasks = sampler.next_batch(cfg.train.prompts_per_step, domain_weights)
            samples = policy.sample(tasks, cfg.train.samples_per_prompt, gen, step_generator(cfg.seed, step, 0))
            t1 = time.perf_counter()
            score_samples(samples, domains)
            t2 = time.perf_counter()
            assign_advantages(samples, cfg)
            stats = learner.update(learner.build_batch(samples), step_generator(cfg.seed, step, 1))
            t3 = time.perf_counter()
            metrics = step_metrics(samples, stats, (t1 - t0, t2 - t1, t3 - t2), cfg.rl.kl_coef, domain_weights)
            sinks.log(step, metrics)
            bar.advance(step, metrics)
            if cfg.eval.every_steps and (step + 1) % cfg.eval.every_steps == 0 and step + 1 < cfg.train.total_steps:
                run_eval(policy, domains, cfg, run_dir, step + 1, log)

    run_eval(policy, domains, cfg, run_dir, cfg.train.total_steps, log)
    save_model(policy, run_dir / "final")
    sinks.close()
    log(f"trained policy saved to {run_dir / 'final'}")
    return run_dir


# ---------------------------------------------------------------------------- the loop's parts


def score_samples(samples: list[Sample], domains: dict[str, Domain]) -> None:
    """Grade every sample with its own domain, one batched call per domain."""
    by_domain: dict[str, list[Sample]] = {}
    for s in samples:
        by_domain.setdefault(s.task.domain, []).append(s)
    for name, group in by_domain.items():
        t0 = time.perf_counter()
        scores = domains[name].score([s.task for s in group], [s.response for s in group])
        share = (time.perf_counter() - t0) / len(group)
        for s, sc in zip(group, scores):
            s.score = sc
            s.timings["reward_s"] = share


def assign_advantages(samples: list[Sample], cfg: Config) -> None:
    """Samples arrive grouped (samples_per_prompt consecutive samples per prompt)."""
    n = cfg.train.samples_per_prompt
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32).view(-1, n)  # [G, N]
    adv = ADVANTAGES.get(cfg.rl.advantage)(rewards, scale_by_std=cfg.rl.scale_by_std).flatten()
    for s, a in zip(samples, adv.tolist()):
        s.advantage = a


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
    total_w = sum(domain_weights.values())
    for name in sorted({s.task.domain for s in samples}):
        mine = [s for s in samples if s.task.domain == name]
        m[f"reward/{name}"] = mean(s.reward for s in mine)
        m[f"pass_rate/{name}"] = mean(bool(s.score and s.score.correct) for s in mine)
        m[f"batch/{name}"] = len(mine) / len(samples)
    for name, w in domain_weights.items():
        m[f"curriculum/weight/{name}"] = w / total_w
    return m


def run_eval(policy: Policy, domains: dict[str, Domain], cfg: Config, run_dir: Path, step: int, log) -> dict:
    e = cfg.eval
    result = evaluate(
        policy, domains, num_problems=e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
        temperature=e.temperature, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed,
    )
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / f"step_{step}.json").write_text(json.dumps(result, indent=1))
    log(f"eval step {step}: " + "; ".join(f"{d}: {fmt_scores(r)}" for d, r in result.items()))
    return result


# ---------------------------------------------------------------------------- setup helpers


def build_domains(cfg: Config) -> dict[str, Domain]:
    domains = {}
    for name, dcfg in cfg.domains.items():
        try:
            domains[name] = make_domain(name, dcfg.params, cfg.seed)
        except UnknownDomainError as e:
            raise UserError(e.args[0]) from None
    return domains


def make_run_dir(cfg: Config) -> Path:
    path = Path(cfg.run.dir) if cfg.run.dir else Path("runs") / f"{cfg.run.name}-{datetime.now():%Y%m%d-%H%M%S}"
    path.mkdir(parents=True, exist_ok=True)
    cfg.run.dir = str(path)  # the saved config names the directory it ran in
    return path


def frozen_copy(model):
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def save_model(policy: Policy, path: Path) -> None:
    policy.model.save_pretrained(path)
    policy.tok.save_pretrained(path)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_generator(seed: int, step: int, stream: int) -> torch.Generator:
    """A fresh generator per (step, purpose): a resumed run replays exactly the same draws."""
    return torch.Generator().manual_seed(hash_seed(seed, step, stream))


def hash_seed(*parts: int) -> int:
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 1099511628211) % 2**63
    return h


def mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0


def fmt_scores(r: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in r.items() if k == "greedy" or k.startswith("pass@"))
