"""A run: the state the loop works on, how it is built, and what it writes down.

    run = open_run(cfg, log, resume=False)    # checks the names, builds (or restores) the whole state
    alerts = run.record(step, record)         # store, metrics, monitors, sinks, spot checks
    score, seesaw = run.evaluate_every(step)  # held-out eval every eval.every_steps, seesaw alerts
    run.checkpoint_every(step, score)         # full state every checkpoint.every_steps
    step, stopped = run.act_on(alerts + seesaw, step)  # rollback to a checkpoint, or stop
    run.finish(step)                          # final/ model, sinks closed, report.html

The loop (`postrl.loop`) does the algorithm; this module keeps the books. Who owns which state:
the policy and its optimiser belong to the learner, the curriculum's weights and levels to the
schedule, the orders in flight to the engine, the rollouts to the store; `Run` holds them side by
side and saves and restores them together (`save_checkpoint`, `load_checkpoint_state`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from postrl.abilities import Closeable, Finite, Stateful, WithGold
from postrl.algo.kl_control import FixedKL, make_kl_controller
from postrl.builtin_models import load_model, resolve_model_path
from postrl.checkpoint import Checkpoint, CheckpointManager
from postrl.config.loading import save_config
from postrl.config.schema import Config, generation_limits, gold_graded_eval_domains
from postrl.curriculum.dynamic import FillResult
from postrl.curriculum.sampler import TaskSampler
from postrl.curriculum.schedule import CarriesOver, make_schedule
from postrl.engines.orders import Rollout
from postrl.engines.pipeline import Pipeline
from postrl.engines.registry import ENGINES
from postrl.errors import UserError
from postrl.evaluation import EVAL_AGGREGATES, evaluate
from postrl.extensions import load as load_extensions
from postrl.faults import crash_point
from postrl.learner.critic import make_critic
from postrl.learner.distributed import start_learners
from postrl.learner.learner import Learner, UpdateStats
from postrl.learner.offpolicy import correction_mode
from postrl.model.device import model_device, resolve_device
from postrl.model.lora import apply_lora, load_policy_weights, make_reference, save_policy
from postrl.monitor.alerts import Alert, AlertLog, dump_samples
from postrl.monitor.base import MonitorContext
from postrl.monitor.monitors import Monitors, build_monitors
from postrl.monitor.report import REPORT_FILE, write_report
from postrl.monitor.seesaw import seesaw_alerts
from postrl.monitor.sinks import MultiSink, make_sinks
from postrl.monitor.step_metrics import StepTimes, step_metrics
from postrl.names import check_names
from postrl.records import Sample
from postrl.rewards.checks.reward_check import check_gates
from postrl.run_dir import make_run_dir
from postrl.sampling.backends import check_model
from postrl.sampling.policy import Policy
from postrl.seeding import seed_everything, set_threads
from postrl.store.rollouts import RolloutStore
from postrl.tasks.base import Domain
from postrl.tasks.catalog import build_domains
from postrl.ui import Progress

CHECKPOINT_FORMAT = 3
"""Bumped when the checkpoint's state changes shape. Format 2 (the learner's optimiser, scheduler and
policy version as three top-level keys, before `Learner.state_dict`) is mapped on load; others are
refused with one line."""


@dataclass
class StepRecord:
    """What one step produced, for the books."""

    samples: list[Sample]
    """The samples trained on (after dynamic sampling)."""
    rollout: Rollout
    fill: FillResult
    stats: UpdateStats
    kl_coef: float
    update_s: float


@dataclass
class Run:
    cfg: Config
    dir: Path
    domains: dict[str, Domain]
    policy: Policy
    learner: Learner
    sampler: TaskSampler
    schedule: Any
    """The curriculum (`postrl.curriculum.schedule`): it owns the domain weights and levels."""
    kl_ctl: FixedKL
    engine: Pipeline
    """Where each step's prompts are sampled and scored (`postrl.engines`, by `cfg.engine`)."""
    store: RolloutStore
    monitors: Monitors
    ckpt: CheckpointManager
    progress: Progress
    log: Any
    sinks: MultiSink | None = None
    alert_log: AlertLog | None = None
    start_step: int = 0
    rollbacks: int = 0
    eval_best: dict[str, list] = field(default_factory=dict)
    """{domain: [best eval.best_metric so far, step]}: the seesaw alert's reference."""
    eval_domains: dict[str, Domain] = field(default_factory=dict)
    """Eval-only domains (`eval.domains`): evaluated with the trained ones, never sampled for training."""
    eval_s: float | None = None
    """Wall seconds of the eval made since the last step was recorded (eval N runs before step N:
    eval.at_start's at 0, eval.every_steps' after step N-1), which `record` logs as step N's
    `time/eval_s`; None when there was none. Checkpoint N is written after eval N, so it keeps this."""

    def record(self, step: int, rec: StepRecord) -> list[Alert]:
        """Store the step's rollouts, log its metrics, run the monitors, dump spot checks; returns
        the monitors' alerts (their actions are carried out by `act_on`)."""
        self.store.write(step, rec.samples)
        crash_point("step.stored")
        sync_s = sum(s.timings.get("sync_s", 0.0) for s in rec.rollout.samples)
        times = StepTimes(rec.rollout.sample_s, rec.rollout.reward_s, rec.update_s, sync_s)
        metrics = step_metrics(rec.samples, rec.stats, times, rec.kl_coef)
        metrics |= rec.fill.metrics() | self.schedule.metrics() | self.engine.metrics()
        if self.eval_s is not None:  # the eval before this step: apart from its sample/reward/update times
            metrics["time/eval_s"], self.eval_s = self.eval_s, None
        self.engine.metrics_recorded()  # the engine's per-step sums start again for the next step
        alerts = self.monitors.update(step, metrics, rec.samples)
        self.sinks.log(step, {**metrics, **self.monitors.values()})
        self.alert_log.record(alerts)
        every = self.cfg.monitor.spot_check_every_steps
        if every and step % every == 0:
            dump_samples(self.dir, step, rec.samples, k=self.cfg.monitor.spot_check_k, seed=self.cfg.seed)
        self.progress.advance(step, metrics)
        return alerts

    def evaluate(self, step: int) -> tuple[float, list[Alert]]:
        """Evaluate every domain's held-out split, write eval/step_N.json, check for seesaw
        regressions; returns the best-checkpoint score and the seesaw alerts (recorded here; the
        caller hands them to `act_on`, which carries out their action)."""
        t0 = time.perf_counter()
        e = self.cfg.eval
        domains = {**self.domains, **self.eval_domains}
        result = evaluate(
            self.policy, domains, num_problems=e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
            temperature=e.temperature, max_new_tokens=self.cfg.train.max_new_tokens, seed=self.cfg.seed,
            limits={name: generation_limits(self.cfg, name) for name in domains},
        )
        (self.dir / "eval").mkdir(exist_ok=True)
        (self.dir / "eval" / f"step_{step}.json").write_text(json.dumps(result, indent=1))
        self.monitors.observe_eval(step, result)  # proxy_gold: held-out gold for the update of this step
        self.log(f"eval step {step}: " + "; ".join(f"{d}: {fmt_scores(r)}" for d, r in result.items()))
        scores = {d: float(r[e.best_metric]) for d, r in result.items() if e.best_metric in r}
        seesaw = seesaw_alerts(self.eval_best, scores, step, e.seesaw_drop, e.seesaw_action, e.best_metric)
        self.alert_log.record(seesaw)
        self.eval_s = time.perf_counter() - t0  # the final eval's, after the last step, goes in no step's metrics
        return EVAL_AGGREGATES.get(e.best_aggregate)(list(scores.values())), seesaw

    def evaluate_at_start(self) -> None:
        """With eval.at_start, the base model's scores at step 0 (a fresh run, not a resumed one):
        the seesaw alerts' first reference. Eval draws from its own generators, not the training
        streams, so the run's rollouts and weights are those of a run without it."""
        if self.cfg.eval.at_start and self.start_step == 0:
            self.evaluate(0)

    def evaluate_every(self, step: int) -> tuple[float | None, list[Alert]]:
        """`evaluate` after every eval.every_steps steps but the last (the final eval follows the
        loop): (score, seesaw alerts), or (None, []) at a step without eval."""
        every = self.cfg.eval.every_steps
        if every and step % every == 0 and step < self.cfg.train.total_steps:
            return self.evaluate(step)
        return None, []

    def checkpoint_every(self, step: int, score: float | None) -> None:
        every = self.cfg.checkpoint.every_steps
        if every and step % every == 0:
            save_checkpoint(self, step, score)

    def act_on(self, alerts: list[Alert], step: int) -> tuple[int, bool]:
        """Carry out the alerts' actions: roll back to the checkpoint `rollback_target` picks (while
        rollbacks are left and one exists), or stop with a checkpoint. Returns (next step, stopped)."""
        actions = {a.action for a in alerts}
        monitor = self.cfg.monitor
        rolls_back = "rollback" in actions and self.rollbacks < monitor.max_rollbacks
        target = rollback_target(self.ckpt, alerts) if rolls_back else None  # None: none intact
        if target is not None:
            return restore_checkpoint(self, lr_factor=monitor.rollback_lr_factor, ckpt=target), False
        if actions & {"stop", "rollback"}:
            self.log(f"stopping at step {step}: alert {', '.join(a.name for a in alerts)}")
            save_checkpoint(self, step, None)
            return step, True
        return step, False

    def check_learners(self, step: int) -> None:
        """`train.learners` > 1: a learner rank that is gone stops the run here, between steps, with
        a checkpoint of this step to resume from; sharded (`train.shard: fsdp`), the rank's shards are
        gone with it, and the run resumes from its newest checkpoint."""
        dead = self.learner.dead_ranks()
        if not dead:
            return
        ranks = ", ".join(f"rank {r} (exit code {code})" for r, code in dead)
        if self.learner.sharded:
            self.learner.close()
            raise UserError(f"learner {ranks} stopped before step {step}, and its shards of the parameters and "
                            f"optimiser state with it; the newest checkpoint is where the run continues: "
                            f"postrl train --resume {self.dir}")
        save_checkpoint(self, step, None)
        self.learner.close()
        raise UserError(f"learner {ranks} stopped before step {step}; a checkpoint of step {step} was written: "
                        f"postrl train --resume {self.dir}")

    def finish(self, step: int) -> None:
        self.engine.close()
        self.learner.close()
        self.policy.close()  # its sampling backend: vLLM's engine and process group
        save_model(self.policy, self.dir / "final")
        for d in [*self.domains.values(), *self.eval_domains.values()]:
            for part in (d, d.gold if isinstance(d, WithGold) else None):  # its monitoring-only gold scorer too
                if isinstance(part, Closeable):
                    part.close()
        report = write_report(self.dir)  # before the sinks close: trackers upload it
        self.sinks.close()
        for line in [f"report: {report}", *self.sinks.where()]:
            self.log(line)


def open_run(cfg: Config, log=print, resume: bool = False) -> Run:
    """Build a run from its config; with `resume`, continue from the newest intact checkpoint.
    Every name in the config is checked, the domains built and the model loaded before the run
    directory is made, so bad input leaves nothing behind."""
    load_extensions(cfg.imports)  # already loaded by the commands (load_recipe); a Config made in Python
    check_names(cfg)
    correction = correction_mode(cfg)  # rl.rollout_correction.mode resolved by the backend's facts
    device = resolve_device(cfg.run.device)  # cuda asked for and absent: an error now, never a CPU fallback
    seed_everything(cfg.seed)
    set_threads(cfg.run.threads)
    domains = build_domains(cfg, device)  # reward models (`reward_models`) on the trainer's device
    check_gates(cfg.domains, domains, cfg.base_dir)  # domains.NAME.reward_check: below min_kappa, no run
    set_steps_from_epochs(cfg, domains, log)
    eval_domains = build_domains(dataclasses.replace(cfg, domains=cfg.eval.domains), device) if cfg.eval.domains else {}
    model, tok = load_model(cfg.model.name, cfg.model.dtype, log=log)
    model = apply_lora(model, cfg.model.lora)  # unchanged unless model.lora.r > 0
    model = model.to(device)  # sampler, learner and reference share this device; tensors are made on it
    check_model(cfg.rollout, model)  # a backend that cannot sample from it (vLLM: architecture, head size)
    critic = make_critic(cfg, model, tok, lambda name: load_model(name, cfg.model.dtype, log=log))  # critic.model, before the run dir
    run_dir = make_run_dir(cfg, resume, log)
    if not resume:
        save_config(cfg, run_dir / "config.yaml")  # a new run's first write: what marks its directory
    policy = Policy(model, tok, rollout=cfg.rollout)
    ref_model = make_reference(model) if cfg.rl.kl_coef > 0 else None  # LoRA: the base, adapters off
    weights = {name: d.weight for name, d in cfg.domains.items()}
    sampler = TaskSampler(domains, cfg.seed, cfg.curriculum.domain_draw)
    schedule = make_schedule(cfg.curriculum, weights, {n: list(d.levels) for n, d in domains.items()})
    engine = ENGINES.get(cfg.engine)(policy, domains, cfg, log)  # it may take cores: the ranks get what is left
    ranks = start_learners(cfg, str(resolve_model_path(cfg.model.name)), model_device(model), run_dir,
                           correction, log) if cfg.train.learners > 1 else None  # this process: rank 0
    learner = Learner(policy, ref_model, cfg.train, cfg.rl, cfg.model, is_cap=cfg.pipeline.is_cap,
                      proximal=cfg.pipeline.proximal, ranks=ranks, correction=correction, critic=critic)
    run = Run(
        cfg=cfg, dir=run_dir, domains=domains, policy=policy, learner=learner, sampler=sampler, schedule=schedule,
        kl_ctl=make_kl_controller(cfg.rl.kl_coef, cfg.rl.kl_target, cfg.rl.kl_horizon), engine=engine,
        store=RolloutStore(run_dir, run=cfg.run.name),
        monitors=build_monitors(cfg.monitor, MonitorContext({n: d.reward for n, d in cfg.domains.items()},
                                                            gold_graded_eval_domains(cfg))),
        ckpt=CheckpointManager(run_dir, keep_last=cfg.checkpoint.keep_last, log=log),
        progress=Progress(cfg.train.total_steps, enabled=cfg.run.progress), log=log, eval_domains=eval_domains,
    )
    if resume:
        latest = run.ckpt.latest_valid()
        if latest is None:
            log(f"no intact checkpoint in {run_dir}; starting from step 0")
        else:
            run.start_step = load_checkpoint_state(run, latest)
            log(f"resuming {run_dir} from step {run.start_step}")
        save_config(cfg, run_dir / "config.yaml")  # after the checkpoint took: a refused resume leaves the config it resumes
    open_outputs(run, run.start_step)
    log(f"run directory: {run_dir}")
    for line in [f"report: {run_dir / REPORT_FILE} (written at the end; any time: postrl report {run_dir})",
                 *run.sinks.where()]:
        log(line)
    return run


def open_outputs(run: Run, start_step: int) -> None:
    """(Re)open the append-only outputs so that nothing from step `start_step` on survives:
    those steps are about to be produced again, exactly once. Checkpoints of later steps go too: after
    a rollback to an earlier one they hold the abandoned branch, which a resume must never pick."""
    if run.sinks is not None:
        run.sinks.close()
    run.store.truncate_after(start_step - 1 if start_step > 0 else None)
    run.ckpt.drop_after(start_step)
    run.sinks = make_sinks(run.dir, run.cfg.monitor.sinks, run_name=run.cfg.run.name, resume_step=start_step)
    run.alert_log = AlertLog(run.dir, resume_step=start_step)


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(run: Run, step: int, score: float | None) -> None:
    state = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "learner": run.learner.state_dict(),  # optimiser (bf16: fp32 masters), LR schedule, policy version
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "sampler": run.sampler.state_dict(),
        "domains": {n: d.state_dict() for n, d in run.domains.items() if isinstance(d, Stateful)},  # epoch cursors
        "trained_domains": list(run.domains),  # what the schedule's state is for: see restore_schedule
        "schedule": run.schedule.state_dict(),
        "kl_controller": run.kl_ctl.state_dict(),
        "monitors": run.monitors.state_dict(),
        "rollout_step": run.store.last_step(),
        "rollbacks": run.rollbacks,
        "eval_best": run.eval_best,
        "eval_s": run.eval_s,  # this step's eval, made before the checkpoint: for the step's time/eval_s
        "pipeline": run.engine.state_dict(),  # orders in flight, drained: see postrl.engines.pipeline
    }
    run.ckpt.save(step, state, lambda path: save_model(run.policy, path), score=score)


def load_checkpoint_state(run: Run, ckpt) -> int:
    """Load every state component from `ckpt` into `run`; returns the next step to run."""
    state = upgrade_checkpoint_state(ckpt.load_state(), ckpt.path)
    restore_schedule(run, state)  # first: refused, nothing is loaded yet
    load_policy_weights(run.policy.model, ckpt.model_dir)  # LoRA: the adapters only; first: bf16 masters follow
    run.learner.load_state_dict(state["learner"])  # data-parallel ranks: they get it with the next update
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    run.sampler.load_state_dict(state["sampler"])
    for name, domain_state in state.get("domains", {}).items():
        if name in run.domains and isinstance(run.domains[name], Stateful):
            run.domains[name].load_state_dict(domain_state)
    run.kl_ctl.load_state_dict(state["kl_controller"])
    run.monitors.load_state_dict(state["monitors"])
    run.rollbacks = state["rollbacks"]
    run.eval_best = {d: list(v) for d, v in state["eval_best"].items()}
    run.eval_s = state.get("eval_s")  # a checkpoint from before time/eval_s: None
    run.engine.load_state_dict(state["pipeline"], state["step"])
    return state["step"]


def restore_schedule(run: Run, state: dict) -> None:
    """The curriculum's state from a checkpoint's `state`, written while the run trained the domains
    it names ("trained_domains"; in a checkpoint from before that key, its schedule's weights' names,
    else unknown and taken as the run's). A run resumed with other domains (the recipe changed
    between sittings) goes on with a per-domain schedule's state carried over (`CarriesOver`: the
    domains still trained keep theirs, a new one starts from its recipe weight, a dropped one's is
    discarded), and says which in one line; any other schedule is refused in one line."""
    saved, now = state["schedule"], list(run.domains)
    weights = saved.get("weights")
    trained = state.get("trained_domains", list(weights) if isinstance(weights, dict) else None)
    if trained is None or set(trained) == set(now):
        run.schedule.load_state_dict(saved)
        return
    added, dropped = [d for d in now if d not in trained], [d for d in trained if d not in now]
    change = f"added {', '.join(added) or 'none'}; dropped {', '.join(dropped) or 'none'}"
    if not isinstance(run.schedule, CarriesOver):
        raise UserError(f"cannot resume {run.dir} with other domains than its checkpoint's ({change}): "
                        f"curriculum.schedule {run.cfg.curriculum.schedule!r} keeps no per-domain state to carry "
                        f"over; resume with the checkpoint's domains {', '.join(trained)}")
    run.schedule.load_state_dict(run.schedule.carry_over(saved))
    run.log(f"resuming with other domains than the checkpoint's: {change} (a new domain starts from its "
            "recipe weight, a dropped one's curriculum state is discarded)")


def upgrade_checkpoint_state(state: dict, where) -> dict:
    """`state` (a checkpoint's state.pt) in this version's layout: format 2's learner keys are moved
    under "learner"; a format other than 2 or CHECKPOINT_FORMAT is refused with one line. Keys added
    within a format ("trained_domains", "eval_s") are read with a default where they are used."""
    found = state.get("format", 1)  # format 1 had no number
    if found == 2:
        state = dict(state)
        state["learner"] = {key: state.pop(key) for key in ("optimizer", "scheduler", "policy_version")}
        state["format"] = CHECKPOINT_FORMAT
    elif found != CHECKPOINT_FORMAT:
        raise UserError(f"{where}: checkpoint format {found}, written by "
                        f"{'an older' if found < CHECKPOINT_FORMAT else 'a newer'} postrl; this version resumes "
                        f"formats 2 and {CHECKPOINT_FORMAT} only: start the run again")
    return state


def restore_checkpoint(run: Run, lr_factor: float = 1.0, ckpt: Checkpoint | None = None) -> int:
    """Rollback: back to `ckpt` (default: the newest intact checkpoint), with the learning rate scaled
    by lr_factor. The rollbacks are counted by the run, not read back from the checkpoint: one written
    before earlier rollbacks would forget them, and max_rollbacks would never be reached."""
    rollbacks = run.rollbacks
    step = load_checkpoint_state(run, ckpt or run.ckpt.latest_valid())
    run.rollbacks = rollbacks + 1
    run.learner.scale_lr(lr_factor)
    open_outputs(run, step)
    run.log(f"rolled back to step {step}; learning rate x{lr_factor} (rollback {run.rollbacks})")
    return step


# ---------------------------------------------------------------------------- helpers


def set_steps_from_epochs(cfg: Config, domains: dict[str, Domain], log) -> None:
    """`train.epochs` > 0: total_steps from the finite domains' training rows (saved in config.yaml)."""
    if cfg.train.epochs <= 0:
        return
    rows = sum(d.train_size for d in domains.values() if isinstance(d, Finite))
    if rows == 0:
        raise UserError("config key 'train.epochs' needs a finite (dataset) domain; use train.total_steps")
    cfg.train.total_steps = max(1, math.ceil(cfg.train.epochs * rows / cfg.train.prompts_per_step))
    log(f"train.epochs={cfg.train.epochs:g} over {rows} rows: {cfg.train.total_steps} steps")


def rollback_target(ckpts: CheckpointManager, alerts: list[Alert]) -> Checkpoint | None:
    """The checkpoint a rollback restores. An alert whose data names `rollback_step` (proxy_gold: the
    step where gold peaked) asks for the weights that sampled that step, which checkpoint N holds
    for step N: the nearest intact checkpoint at or before the earliest step named, or, none being
    kept there, the nearest after it. Otherwise the newest intact checkpoint."""
    named = [int(a.data["rollback_step"]) for a in alerts if a.action == "rollback" and "rollback_step" in a.data]
    return ckpts.nearest_valid(min(named)) if named else ckpts.latest_valid()


def save_model(policy: Policy, path: Path) -> None:
    save_policy(policy.model, policy.tok, path)  # LoRA: adapters merged into a full HF dir, plus adapter/


def fmt_scores(r: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in r.items() if k == "greedy" or k.startswith("pass@"))
