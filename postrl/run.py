"""A run's state: everything the loop touches, how it is built, checkpointed and restored.

    run = open_run(cfg, log, resume=False)   # builds (or restores) the whole state
    save_checkpoint(run, step, score)        # full state after `step` steps
    step = restore_checkpoint(run)           # back to the newest intact checkpoint
    run.finish(step)                         # final/ model, sinks closed, report.html
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from postrl.algo.kl_control import FixedKL, make_kl_controller
from postrl.checkpoint import CheckpointManager
from postrl.config import Config, save_config
from postrl.curriculum.sampler import TaskSampler
from postrl.curriculum.schedule import make_schedule
from postrl.errors import UserError
from postrl.monitor.alerts import AlertLog
from postrl.monitor.monitors import MonitorContext, Monitors, build_monitors
from postrl.monitor.report import write_report
from postrl.monitor.sinks import MultiSink, make_sinks
from postrl.policy.lora import apply_lora, load_policy_weights, make_reference, save_policy
from postrl.policy.model import load_model
from postrl.policy.policy import Policy
from postrl.policy.update import Learner
from postrl.rewards.rm import register_rm_term
from postrl.seeding import seed_everything, set_threads
from postrl.store import RolloutStore
from postrl.tasks.base import Domain, UnknownDomainError, make_domain
from postrl.ui import Progress


@dataclass
class Run:
    cfg: Config
    dir: Path
    domains: dict[str, Domain]
    policy: Policy
    learner: Learner
    sampler: TaskSampler
    schedule: Any
    kl_ctl: FixedKL
    store: RolloutStore
    sinks: MultiSink
    monitors: Monitors
    alert_log: AlertLog
    ckpt: CheckpointManager
    progress: Progress
    log: Any
    domain_weights: dict[str, float] = field(default_factory=dict)
    start_step: int = 0
    rollbacks: int = 0
    eval_best: dict[str, list] = field(default_factory=dict)
    """{domain: [best eval.best_metric so far, step]}: the seesaw alert's reference."""
    engine: Any = None
    """Where each step's prompts are sampled and scored (`postrl.engines`, by `cfg.engine`)."""

    def finish(self, step: int) -> None:
        self.engine.close()
        save_model(self.policy, self.dir / "final")
        self.sinks.close()
        for d in self.domains.values():
            if hasattr(d, "close"):
                d.close()
        write_report(self.dir)


def open_run(cfg: Config, log=print, resume: bool = False) -> Run:
    """Build a run from its config; with `resume`, continue from the newest intact checkpoint."""
    seed_everything(cfg.seed)
    set_threads(cfg.run.threads)
    run_dir = make_run_dir(cfg, resume)
    save_config(cfg, run_dir / "config.yaml")
    for term, model_dir in cfg.reward_models.items():  # before the domains, whose reward terms may use them
        register_rm_term(term, model_dir)
    domains = build_domains(cfg)
    model, tok = load_model(cfg.model.name, cfg.model.dtype, log=log)
    model = apply_lora(model, cfg.model.lora)  # unchanged unless model.lora.r > 0
    policy = Policy(model, tok)
    ref_model = make_reference(model) if cfg.rl.kl_coef > 0 else None  # LoRA: the base, adapters off
    weights = {name: d.weight for name, d in cfg.domains.items()}
    run = Run(
        cfg=cfg, dir=run_dir, domains=domains, policy=policy,
        learner=Learner(policy, ref_model, cfg.train, cfg.rl, cfg.model, is_cap=cfg.pipeline.is_cap),
        sampler=TaskSampler(domains, cfg.seed),
        schedule=make_schedule(cfg.curriculum, weights, {n: list(d.levels) for n, d in domains.items()}),
        kl_ctl=make_kl_controller(cfg.rl.kl_coef, cfg.rl.kl_target, cfg.rl.kl_horizon),
        store=RolloutStore(run_dir, run=cfg.run.name), sinks=None, monitors=None, alert_log=None,
        ckpt=CheckpointManager(run_dir, keep_last=cfg.checkpoint.keep_last, log=log),
        progress=Progress(cfg.train.total_steps, enabled=cfg.run.progress), log=log, domain_weights=weights,
    )
    run.monitors = build_monitors(cfg.monitor, MonitorContext({n: d.reward for n, d in cfg.domains.items()}))
    from postrl.engines import ENGINES  # here, not at the top: engines/ builds on this module

    run.engine = ENGINES.get(cfg.engine)(run)
    if resume:
        latest = run.ckpt.latest_valid()
        if latest is None:
            log(f"no intact checkpoint in {run_dir}; starting from step 0")
        else:
            run.start_step = load_checkpoint_state(run, latest)
            log(f"resuming {run_dir} from step {run.start_step}")
    open_outputs(run, run.start_step)
    log(f"run directory: {run_dir}")
    return run


def open_outputs(run: Run, start_step: int) -> None:
    """(Re)open the append-only outputs so that nothing from step `start_step` on survives:
    those steps are about to be produced again, exactly once."""
    if run.sinks is not None:
        run.sinks.close()
    run.store.truncate_after(start_step - 1 if start_step > 0 else None)
    run.sinks = make_sinks(run.dir, run.cfg.monitor.sinks, run_name=run.cfg.run.name, resume_step=start_step)
    run.alert_log = AlertLog(run.dir, resume_step=start_step)


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(run: Run, step: int, score: float | None) -> None:
    state = {
        "step": step,
        "policy_version": run.policy.version,
        "optimizer": run.learner.opt.state_dict(),
        "scheduler": run.learner.sched.state_dict(),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "sampler": run.sampler.state_dict(),
        "schedule": run.schedule.state_dict(),
        "domain_weights": run.domain_weights,
        "kl_controller": run.kl_ctl.state_dict(),
        "monitors": run.monitors.state_dict(),
        "rollout_step": run.store.last_step(),
        "rollbacks": run.rollbacks,
        "eval_best": run.eval_best,
        "pipeline": run.engine.state_dict(),  # orders in flight, drained: see postrl.engines.pipeline
    }
    run.ckpt.save(step, state, lambda path: save_model(run.policy, path), score=score)


def load_checkpoint_state(run: Run, ckpt) -> int:
    """Load every state component from `ckpt` into `run`; returns the next step to run."""
    state = ckpt.load_state()
    load_weights(run.policy.model, ckpt.model_dir)
    run.policy.version = state["policy_version"]
    run.learner.opt.load_state_dict(state["optimizer"])
    run.learner.sched.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    run.sampler.load_state_dict(state["sampler"])
    run.schedule.load_state_dict(state["schedule"])
    run.domain_weights = dict(state["domain_weights"])
    run.kl_ctl.load_state_dict(state["kl_controller"])
    run.monitors.load_state_dict(state["monitors"])
    run.rollbacks = state["rollbacks"]
    run.eval_best = {d: list(v) for d, v in state.get("eval_best", {}).items()}  # absent before seesaw alerts
    run.engine.load_state_dict(state.get("pipeline"), state["step"])  # absent before the pipeline
    return state["step"]


def restore_checkpoint(run: Run, lr_factor: float = 1.0) -> int:
    """Rollback: back to the newest intact checkpoint, with the learning rate scaled by lr_factor."""
    latest = run.ckpt.latest_valid()
    step = load_checkpoint_state(run, latest)
    run.rollbacks += 1
    for group in run.learner.opt.param_groups:
        group["lr"] *= lr_factor
    run.learner.sched.base_lrs = [lr * lr_factor for lr in run.learner.sched.base_lrs]
    open_outputs(run, step)
    run.log(f"rolled back to step {step}; learning rate x{lr_factor} (rollback {run.rollbacks})")
    return step


# ---------------------------------------------------------------------------- helpers


def build_domains(cfg: Config) -> dict[str, Domain]:
    domains = {}
    for name, dcfg in cfg.domains.items():
        try:
            domains[name] = make_domain(name, dcfg.params, cfg.seed)
        except UnknownDomainError as e:
            raise UserError(e.args[0]) from None
    return domains


def make_run_dir(cfg: Config, resume: bool) -> Path:
    from datetime import datetime

    if resume:
        path = Path(cfg.run.dir)
        if not path.is_dir():
            raise UserError(f"cannot resume: run directory {path} does not exist")
        return path
    path = Path(cfg.run.dir) if cfg.run.dir else Path("runs") / f"{cfg.run.name}-{datetime.now():%Y%m%d-%H%M%S}"
    path.mkdir(parents=True, exist_ok=True)
    cfg.run.dir = str(path)  # the saved config names the directory it ran in
    return path


def save_model(policy: Policy, path: Path) -> None:
    save_policy(policy.model, policy.tok, path)  # LoRA: adapters merged into a full HF dir, plus adapter/


def load_weights(model, path: Path) -> None:
    load_policy_weights(model, path)  # LoRA: the adapters only
