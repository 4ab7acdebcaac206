"""The training loop: group-relative policy optimisation with verifiable rewards (GRPO family).

Per step:
  1. draw `prompts_per_step` tasks from the domain mixture (domain weights and per-problem
     keep-probabilities from the curriculum schedule, `postrl.curriculum.schedule`);
  2. sample `samples_per_prompt` completions for each, recording behaviour log-probs; with
     `pipeline.max_staleness` K > 0, 1-3 run for step q at the start of step q - K, on the rollout
     side (threads, or Ray actors with `engine: ray`; `postrl.engines.pipeline`);
  3. score every completion with its domain's verifier (plus any weighted reward terms), each group
     as soon as its samples exist; with dynamic sampling, drop groups whose rewards are all equal
     and draw more through the same engine (`postrl.curriculum.dynamic`);
  4. advantages relative to the other completions of the same prompt, and the reference
     log-probs: the step's batch (`Learner.build_batch`);
  5. `ppo_epochs` x `minibatches` clipped policy-gradient steps with a KL penalty to the frozen
     initial policy (the reference);
  6. update the curriculum from every group drawn.
Then the books (`Run.record`: rollouts stored, metrics, monitors, spot checks), and between steps
eval, checkpoints, and the monitors' rollback or stop (`postrl.run`).

Departures from the GRPO paper (Shao et al., 2024), each a config switch:
  - token-mean loss aggregation (DAPO) instead of per-sequence means (`rl.loss_agg`);
  - separate lower/upper clip ranges, clip-higher (DAPO) (`rl.clip_low`, `rl.clip_high`);
  - scaling advantages by the group std is optional (Dr. GRPO) (`rl.scale_by_std`);
  - the sampler's behaviour log-probs are reused as the "old" log-probs: no extra forward pass,
    and the first minibatch is exactly on-policy; batches sampled by older weights (K > 0) get
    decoupled PPO instead: clip around the trainer's weights, times a truncated importance weight
    (`pipeline.is_cap`, see `postrl.algo.losses.truncated_is_weight`); where the sampler's
    numerics are not the learner's (an inference engine), every row gets the learner's log-probs
    as the trust region's centre and a masked or truncated weight instead (`rl.rollout_correction`,
    `postrl.algo.correction`; auto: seq_mask there, none with postrl's own backend);
  - the KL term (k3, as in GRPO) can move into the reward (`rl.kl_in: reward`), and its
    coefficient can follow a target KL (`rl.kl_target`); it is skipped entirely at `kl_coef: 0`.

Everything a resumed run needs is in the checkpoint (see `postrl.checkpoint`); randomness is drawn
from generators seeded by (seed, step), so a run resumed from step N replays exactly the steps an
uninterrupted run would have taken.
"""

from __future__ import annotations

import time
from pathlib import Path

from postrl.config.schema import Config
from postrl.curriculum.dynamic import FillResult, fill_batch, passthrough
from postrl.errors import UserError
from postrl.extensions import load_recipe
from postrl.records import Sample, Task
from postrl.run import Run, StepRecord, open_run
from postrl.seeding import step_generator


def train(cfg: Config, log=print, resume: bool = False) -> Path:
    """Run RL post-training as configured; returns the run directory (trained model in final/)."""
    run = open_run(cfg, log, resume)
    learner, step, stopped = run.learner, run.start_step, False
    run.evaluate_at_start()  # eval.at_start: the base model's scores, the seesaw's first reference
    with run.progress:
        while step < cfg.train.total_steps and not stopped:
            run.check_learners(step)  # train.learners > 1: a rank that is gone stops the run, checkpointed
            # 1-3. tasks drawn by the curriculum, sampled and scored (K > 0: submitted K steps ahead)
            submit_ahead(run, step)
            rollout = run.engine.take(step)
            t0 = time.perf_counter()
            fill = refill(run, step, rollout.samples)  # dynamic sampling, when on: groups with reward spread
            samples = fill.kept or rollout.samples  # none found within the cap: the draw (all-zero advantages)
            # 4. group-relative advantages, reference log-probs
            kl_coef = run.kl_ctl.coef
            batch = learner.build_batch(samples, kl_coef)
            # 5. clipped policy gradient with the KL penalty
            stats = learner.update(batch, kl_coef, step_generator(cfg.seed, step, 1))
            run.kl_ctl.update(stats.kl_mean)
            update_s = time.perf_counter() - t0 - fill.seconds
            # 6. curriculum from every group drawn
            run.schedule.update(step, fill.drawn)

            alerts = run.record(step, StepRecord(samples, rollout, fill, stats, kl_coef, update_s))
            step += 1
            score, seesaw = run.evaluate_every(step)  # held-out eval, seesaw alerts
            run.checkpoint_every(step, score)
            step, stopped = run.act_on(alerts + seesaw, step)  # the monitors' alerts, then the seesaw's

    if not stopped:
        run.evaluate(step)  # the final eval: its seesaw alerts are logged, with no step left to act on
    run.finish(step)
    log(f"trained policy saved to {run.dir / 'final'}")
    return run.dir


def draw_tasks(run: Run, n: int) -> list[Task]:
    """The one way tasks are drawn: the curriculum's domain weights and keep-probabilities."""
    return run.sampler.next_batch(n, run.schedule.weights, run.schedule.task_weight)


def submit_ahead(run: Run, step: int) -> None:
    """Hand the engine this step's tasks, and with max_staleness K the tasks of the steps up to
    step + K (drawn now, in step order, from the curriculum as it is now)."""
    for ahead in run.engine.to_submit(step):
        run.engine.submit(ahead, draw_tasks(run, run.cfg.train.prompts_per_step))


def refill(run: Run, step: int, samples: list[Sample]) -> FillResult:
    """Dynamic sampling when `curriculum.dynamic_sampling` is on (`postrl.curriculum.dynamic`):
    extra rounds draw from the same curriculum and are sampled and scored by the engine
    (`engine.resample`); otherwise the batch as drawn."""
    t, c = run.cfg.train, run.cfg.curriculum
    if not c.dynamic_sampling:
        return passthrough(samples, t.samples_per_prompt)

    def draw(k: int, round_: int) -> list[Sample]:
        return run.engine.resample(step, round_, draw_tasks(run, k)).samples

    return fill_batch(samples, draw, t.samples_per_prompt, c.max_extra_draws, t.minibatches)


def resume_config(run_dir: str | Path, overrides: list[str], imports: list[str] = ()) -> Config:
    """The config a run was started with, plus overrides (e.g. a larger train.total_steps)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"cannot resume {run_dir}: no config.yaml (is it a postrl run directory?)")
    return load_recipe(path, overrides, imports)  # its imports loaded first: they may define its names
