"""The training loop: group-relative policy optimisation with verifiable rewards (GRPO family).

Per step:
  1. draw `prompts_per_step` tasks from the domain mixture (domain weights, difficulty levels and
     per-problem keep-probabilities from the curriculum schedule, `postrl.curriculum.schedule`);
  2. sample `samples_per_prompt` completions for each, recording behaviour log-probs;
     with `pipeline.max_staleness` K > 0 this and 3. run on the rollout side (threads, or Ray actors
     with `engine: ray`) up to K steps ahead of the trainer (`postrl.engines.pipeline`);
  3. score every completion with its domain's verifier (plus any weighted reward terms); with
     dynamic sampling, drop groups whose rewards are all equal and draw more (`postrl.curriculum.dynamic`);
  4. advantages relative to the other completions of the same prompt;
  5. `ppo_epochs` x `minibatches` clipped policy-gradient steps with a KL penalty to the frozen
     initial policy (the reference);
  6. store the rollouts, log metrics, run the monitors, update the curriculum from every group drawn.

Departures from the GRPO paper (Shao et al., 2024), each a config switch:
  - token-mean loss aggregation (DAPO) instead of per-sequence means (`rl.loss_agg`);
  - separate lower/upper clip ranges, clip-higher (DAPO) (`rl.clip_low`, `rl.clip_high`);
  - scaling advantages by the group std is optional (Dr. GRPO) (`rl.scale_by_std`);
  - the sampler's behaviour log-probs are reused as the "old" log-probs: no extra forward pass,
    and the first minibatch is exactly on-policy; batches sampled by older weights (K > 0) get
    decoupled PPO instead: clip around the trainer's weights, times a truncated importance weight
    (`pipeline.is_cap`, see `postrl.algo.losses.truncated_is_weight`);
  - the KL term (k3, as in GRPO) can move into the reward (`rl.kl_in: reward`), and its
    coefficient can follow a target KL (`rl.kl_target`); it is skipped entirely at `kl_coef: 0`.

Everything a resumed run needs is in the checkpoint (see `postrl.checkpoint`); randomness is drawn
from generators seeded by (seed, step), so a run resumed from step N replays exactly the steps an
uninterrupted run would have taken.
"""

from __future__ import annotations

import time
from pathlib import Path

from postrl.config import Config
from postrl.faults import crash_point
from postrl.monitor.alerts import dump_samples
from postrl.run import open_run, restore_checkpoint, save_checkpoint
from postrl.seeding import step_generator
from postrl.steps import assign_advantages, refill, run_eval, sample_temperatures, step_metrics


def train(cfg: Config, log=print, resume: bool = False) -> Path:
    """Run RL post-training as configured; returns the run directory (trained model in final/)."""
    run = open_run(cfg, log, resume)
    t = cfg.train
    step, stopped = run.start_step, False
    with run.progress as bar:
        while step < t.total_steps and not stopped:
            for ahead in run.engine.to_submit(step):  # this step; async: up to max_staleness steps ahead
                tasks = run.sampler.next_batch(
                    t.prompts_per_step, run.domain_weights, run.schedule.levels(), run.schedule.task_weight
                )
                run.engine.submit(ahead, tasks, sample_temperatures(tasks, t.samples_per_prompt, cfg))  # sample+score
            rollout = run.engine.take(step)  # scored samples from weights at most max_staleness steps old
            samples = rollout.samples
            t2 = time.perf_counter()
            fill = refill(run, step, samples)  # dynamic sampling, when on: only groups with reward spread
            samples = fill.kept or samples  # none found within the cap: train on the draw (all-zero advantages)
            batch = run.learner.build_batch(samples)  # reference log-probs, once per batch
            kl_coef = run.kl_ctl.coef
            assign_advantages(samples, batch, cfg, kl_coef)
            stats = run.learner.update(batch, kl_coef, step_generator(cfg.seed, step, 1))
            run.kl_ctl.update(stats.kl_mean)
            t3 = time.perf_counter()

            run.store.write(step, samples)
            crash_point("step.stored")
            seconds = (rollout.sample_s, rollout.reward_s, t3 - t2 - fill.seconds)
            metrics = step_metrics(samples, stats, seconds, kl_coef, run.domain_weights)
            metrics |= fill.metrics() | run.schedule.metrics() | run.engine.metrics(stats)
            alerts = run.monitors.update(step, metrics, samples)
            run.sinks.log(step, {**metrics, **run.monitors.values()})
            run.alert_log.record(alerts)
            run.domain_weights = run.schedule.update(step, fill.drawn, run.domain_weights)
            if cfg.monitor.spot_check_every_steps and step % cfg.monitor.spot_check_every_steps == 0:
                dump_samples(run.dir, step, samples, k=cfg.monitor.spot_check_k, seed=cfg.seed)
            bar.advance(step, metrics)
            step += 1

            score = None
            if cfg.eval.every_steps and step % cfg.eval.every_steps == 0 and step < t.total_steps:
                score = run_eval(run, step, alerts)  # seesaw alerts join the step's alerts
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                save_checkpoint(run, step, score)
            actions = {a.action for a in alerts}
            if "rollback" in actions and run.rollbacks < cfg.monitor.max_rollbacks and run.ckpt.steps():
                step = restore_checkpoint(run, lr_factor=cfg.monitor.rollback_lr_factor)
            elif actions & {"stop", "rollback"}:
                log(f"stopping at step {step}: alert {', '.join(a.name for a in alerts)}")
                save_checkpoint(run, step, None)
                stopped = True

    if not stopped:
        run_eval(run, step)
    run.finish(step)
    log(f"trained policy saved to {run.dir / 'final'}")
    return run.dir


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run was started with, plus overrides (e.g. a larger train.total_steps)."""
    from postrl.config import load_config
    from postrl.errors import UserError

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"cannot resume {run_dir}: no config.yaml (is it a postrl run directory?)")
    return load_config(path, overrides)
