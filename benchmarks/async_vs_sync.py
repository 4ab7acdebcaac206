"""Synchronous loop vs the asynchronous pipeline, in threads and in processes, side by side in one run.

    .venv/bin/python benchmarks/async_vs_sync.py [--budget-s 30] [--rounds 2] [--workloads default,small]

Arms, each the real training loop (`postrl.loop.train`, engine: local) from the same model, on the
same 2 cores, stopped once its wall-clock budget is spent (at the loop's `step.stored` point; the
budget includes start-up, so a sampler process's start counts against it):

  sync/1t              synchronous, 1 torch thread
  sync/2t              synchronous, 2 torch threads (both cores)
  threads              max_staleness 1: a sampling thread beside the trainer, 1 torch thread each
  processes            max_staleness 1, pipeline.samplers 1: a sampler process beside the trainer,
                       1 thread each, the reference pass on the sampler (pipeline.reference)
  processes/behaviour  the same with pipeline.proximal behaviour: no proximal pass on the learner

Every arm runs `--rounds` times, in order and then in reverse order, so that a slow spell of the
shared machine falls on all of them. Throughput is completions per second over the median step
(the first step of each round, start-up, left out). Each arm's policy is then scored on the same
held-out problems with the same seeds, every round (pass@1, with the paired standard error of its
difference from the better synchronous arm).

Two bounds from the synchronous arms' own per-step timings, each with the sampler side (generation,
scoring after it, and the reference pass when the samplers run it) and the learner side (the rest
of the step: update, batch building, books); perfect overlap gives step / max(sampler, learner):
  ceiling         the better synchronous arm's sides (the issue's definition);
  one-core bound  the sides as sync/1t times them: what overlap can give when each side has one
                  of the two cores, as in the async arms. The ceiling assumes each side keeps the
                  speed it has on two threads, which it does not: the gap between the two is the
                  machine's two-thread speedup of each side.
The machine is shared, so only ratios measured in one invocation mean much; state `uptime`.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _gain import paired_se  # benchmarks/, on the path when this script runs
from _harness import Bench, parser

from postrl import loop as train_module
from postrl import run as run_module
from postrl.algo.passk import pass_at_k
from postrl.builtin_models import resolve_model_path
from postrl.config.loading import load_config
from postrl.evaluation import count_correct
from postrl.learner import learner as update_module

ARMS = {
    "sync/1t": ["run.threads=1", "pipeline.max_staleness=0"],
    "sync/2t": ["run.threads=2", "pipeline.max_staleness=0"],
    "threads": ["run.threads=2", "pipeline.max_staleness=1"],
    "processes": ["run.threads=2", "pipeline.max_staleness=1", "pipeline.samplers=1", "pipeline.sampler_threads=1"],
    # plain PPO around the sampling weights: no proximal pass on the learner (pipeline.proximal)
    "processes/behaviour": ["run.threads=2", "pipeline.max_staleness=1", "pipeline.samplers=1",
                            "pipeline.sampler_threads=1", "pipeline.proximal=behaviour"],
}
WORKLOADS = {
    "default": [],
    # the two sides close in size on one thread each (about 60 ms each on the tiny model): 8
    # prompts x 8 samples in one minibatch, where the update's ops are too small for a second
    # thread to help much
    "small": ["train.prompts_per_step=8", "train.minibatches=1"],
}


class Budget(Exception):
    """The arm's wall-clock budget is spent."""


def run_arm(cfg, budget_s: float) -> dict:
    """Train until the budget is spent; per-step wall times, the run's step metrics, its policy."""
    runs, ends, reference_s = [], [], []
    original_open, original_logprobs = train_module.open_run, update_module.Learner._logprobs
    train_module.open_run = lambda *a, **k: (runs.append(original_open(*a, **k)), runs[-1])[1]  # to reach the policy

    def timed_logprobs(self, model, *a, **k):  # the learner's reference pass, in `build_batch`
        t0 = time.perf_counter()
        out = original_logprobs(self, model, *a, **k)
        if model is self.ref_model:
            reference_s.append(time.perf_counter() - t0)
        return out

    update_module.Learner._logprobs = timed_logprobs
    start = time.perf_counter()

    def step_done(name: str) -> None:
        ends.append(time.perf_counter())
        if ends[-1] - start > budget_s:
            raise Budget

    run_module.crash_point = step_done
    try:
        train_module.train(cfg, log=lambda *a: None)
    except Budget:
        pass
    finally:
        train_module.open_run, update_module.Learner._logprobs = original_open, original_logprobs
    run = runs[0]
    run.engine.close()
    run.sinks.close()
    if len(ends) < 2:  # the first step carries the start-up; a median needs one more
        raise SystemExit(f"--budget-s {budget_s:g}: {len(ends)} steps finished within it (start-up included); "
                         "give every arm more time")
    metrics = [json.loads(x) for x in (run.dir / "metrics.jsonl").read_text().splitlines()]
    return {"step_s": [b - a for a, b in zip([start, *ends], ends)], "metrics": metrics, "reference_s": reference_s,
            "policy": run.policy, "domain": next(iter(run.domains.values()))}


def held_out(arm: dict, cfg, problems: int, samples: int) -> list[int]:
    """Correct samples per held-out problem (the same problems and seeds for every arm)."""
    torch.set_num_threads(2)
    domain = arm["domain"]
    _, correct = count_correct(arm["policy"], domain, domain.heldout(problems), samples, 1.0,
                               cfg.train.max_new_tokens, cfg.seed, greedy=False)
    return correct


def summarise(rounds: list[dict], cfg, samples: int) -> dict:
    """One arm over its rounds: the steps after each round's first (start-up) pooled; the held-out
    problems of every round side by side."""
    step_s = [x for r in rounds for x in r["step_s"][1:]]
    metrics = [x for r in rounds for x in r["metrics"][1:]]
    reference_s = [x for r in rounds for x in r["reference_s"][1:]]
    correct = [c for r in rounds for c in r["correct"]]
    sec = statistics.median(step_s)
    sampler_side = statistics.median(x["time/sample_s"] + x.get("time/reward_tail_s", 0.0) for x in metrics)
    return {"steps": sum(len(r["step_s"]) for r in rounds) / len(rounds), "sec_per_step": sec,
            "completions_per_s": cfg.train.prompts_per_step * cfg.train.samples_per_prompt / sec,
            "sampler_s": sampler_side, "reference_s": statistics.median(reference_s or [0.0]),
            "pass@1": sum(pass_at_k(samples, c, 1) for c in correct) / len(correct), "correct": correct}


def sides(sync: dict, reference_on_sampler: bool) -> tuple[float, float]:
    """(sampler side s, learner side s) of a synchronous arm's step: generation and the scoring
    after it, plus the reference pass when it runs on the samplers."""
    sampler = sync["sampler_s"] + (sync["reference_s"] if reference_on_sampler else 0.0)
    return sampler, sync["sec_per_step"] - sampler


def run_workload(name: str, a, work: str) -> dict:
    """Every arm, `a.rounds` times, in order and then in reverse order (ABBA), so a slow spell of
    the shared machine falls on every arm alike."""
    path = resolve_model_path(a.model)
    rounds: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    cfgs = {}
    for r in range(a.rounds):
        for arm in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):
            cfgs[arm] = cfg = load_config(a.recipe, [
                f"model.name={path}", f"run.dir={Path(work) / name / arm.replace('/', '-') / str(r)}",
                "train.total_steps=100000", "run.progress=false", "monitor.spot_check_every_steps=0",
                "eval.every_steps=0", *ARMS[arm], *WORKLOADS[name], *a.overrides,
            ])
            out = run_arm(cfg, a.budget_s)
            out["correct"] = held_out(out, cfg, a.eval_problems, a.eval_samples)
            del out["policy"], out["domain"]
            rounds[arm].append(out)
            print(f"  {name} round {r} {arm}: {len(out['step_s'])} steps, "
                  f"{statistics.median(out['step_s'][1:]):.3f} s/step", flush=True)
    return {arm: summarise(rounds[arm], cfgs[arm], a.eval_samples) for arm in ARMS}


def report(name: str, results: dict, a) -> dict[str, float]:
    """The workload's table; returns each process arm's speedup over the better synchronous arm."""
    best = max(("sync/1t", "sync/2t"), key=lambda k: results[k]["completions_per_s"])
    base = results[best]
    # per place of the reference pass: the ceiling (the better synchronous arm's sides,
    # overlapped perfectly) and the one-core bound (each side as long as sync/1t takes for it)
    two = {on_sampler: sides(base, on_sampler) for on_sampler in (False, True)}
    one = {on_sampler: sides(results["sync/1t"], on_sampler) for on_sampler in (False, True)}
    ceilings = {k: (base["sec_per_step"] / max(two[k]), base["sec_per_step"] / max(one[k])) for k in two}
    print(f"\nworkload {name} ({' '.join(WORKLOADS[name]) or 'the recipe as is'}), {a.budget_s:.0f} s per arm and "
          f"round, {a.rounds} rounds; held-out {a.eval_problems} problems x {a.eval_samples} samples per round")
    print(f"| arm | steps per round | s/step | completions/s | vs {best} | share of ceiling | "
          "share of the one-core bound | pass@1 (diff, 2 SE) |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, r in results.items():
        speedup = r["completions_per_s"] / base["completions_per_s"]
        share = bound = ""
        if not arm.startswith("sync"):
            ceiling, one_core = ceilings[arm.startswith("processes")]
            share, bound = f"{speedup / ceiling:.0%}", f"{speedup / one_core:.0%}"
        diff = r["pass@1"] - base["pass@1"]
        se = paired_se(base, r, a.eval_samples)
        print(f"| {arm} | {r['steps']:.0f} | {r['sec_per_step']:.3f} | {r['completions_per_s']:.0f} | {speedup:.2f}x | "
              f"{share} | {bound} | {r['pass@1']:.3f} ({diff:+.3f}, {2 * se:.3f}) |")
    for on_sampler in (False, True):
        (s2, l2), (s1, l1) = two[on_sampler], one[on_sampler]
        print(f"reference pass on the {'sampler' if on_sampler else 'learner'} side: {best} sampler side "
              f"{s2 * 1000:.0f} ms + learner side {l2 * 1000:.0f} ms -> ceiling {ceilings[on_sampler][0]:.2f}x; "
              f"on one thread (sync/1t) {s1 * 1000:.0f} + {l1 * 1000:.0f} ms -> one-core bound "
              f"{ceilings[on_sampler][1]:.2f}x")
    return {arm: r["completions_per_s"] / base["completions_per_s"] for arm, r in results.items()
            if arm.startswith("processes")}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--budget-s", type=float, default=30.0, help="wall-clock training budget per arm and round")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every arm, in alternating order")
    ap.add_argument("--workloads", default="default,small", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="dotted recipe overrides for every arm")
    a = ap.parse_args()
    bench = Bench(__file__, a)
    speedups = {}
    with tempfile.TemporaryDirectory() as work:
        for name in a.workloads.split(","):
            results = run_workload(name, a, work)
            speedups[name] = report(name, results, a)
    for name, by_arm in speedups.items():
        print(f"process-async speedup over the better synchronous arm, {name}: "
              + ", ".join(f"{arm} {v:.2f}x" for arm, v in by_arm.items()))
    name, arm = max(((n, arm) for n, by_arm in speedups.items() for arm in by_arm), key=lambda k: speedups[k[0]][k[1]])
    print(f"best: {arm} on workload {name}")
    bench.result("process_async_speedup", f"{speedups[name][arm]:.2f}", target=1.5)

if __name__ == "__main__":
    main()
