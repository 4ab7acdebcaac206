"""The learner's step time at two commits, side by side: did a change slow the update down?

    .venv/bin/python benchmarks/learner_step.py --base 1c0374e            # that commit vs this working tree
    .venv/bin/python benchmarks/learner_step.py --base 1c0374e -- rl.advantage=gae critic.model=policy
    .venv/bin/python benchmarks/learner_step.py --base HEAD --recipe recipes/smollm2-joint.yaml \
        --rounds 1 --updates 1 -- train.pack_sequences=true   # packing vs not: 18 min on 2 loaded cores

Each tree runs its own code in its own process (`cwd` and `PYTHONPATH` set to it; the base is a
`git worktree` of `--base`, made and removed here): `--recipe`'s model (a relative path is read in
each tree, its own copy) and one step's batch, sampled as the run samples a step (prompts_per_step
tasks drawn across the domains by their weights, samples_per_prompt completions each at the
domain's own max_new_tokens and temperature, scored by the domains' verifiers, code in the
sandbox; a fixed seed, so the same batch in both trees when their sampling code agrees: its
digest is printed), then `Learner.build_batch` + `Learner.update` timed `--updates` times after
one warm-up, one torch thread. The two trees alternate `--rounds` times, so load on the shared
machine falls on both alike, and each tree's fastest update is compared (load only ever adds time;
the medians are printed beside them). Overrides after `--` apply to the new tree only (to time an
objective the base does not have, against the base's default).

The warm-up update starts from the same weights in both trees, on the same batch: its loss, KL,
entropy and gradient norm are printed side by side, so a change meant to compute the same update
(packing, a fused kernel) shows it does, up to float rounding.

Ends with `RESULT learner_step_ratio=<new / base> target<=1.05`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import Bench, parser

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import collections, hashlib, json, os, sys, time, torch
from postrl.config.loading import load_config
from postrl.engines.orders import Order, attach_scores, generate, reward_terms, sample_temperatures, score_chunk
from postrl.run import open_run
from postrl.seeding import step_generator
recipe, overrides, updates, run_dir = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = load_config(recipe, [f"run.dir={run_dir}", "run.overwrite=true", "run.progress=false", "run.threads=1",
                           *overrides])
run = open_run(cfg, log=lambda *a: None)
tasks = run.sampler.next_batch(cfg.train.prompts_per_step, {n: d.weight for n, d in cfg.domains.items()})
# sampled as the run samples a step: each domain's own max_new_tokens, stop strings and temperature
samples = generate(run.policy, Order(0, tasks, sample_temperatures(tasks, cfg), run.policy.version), cfg)
attach_scores(samples, score_chunk(samples, run.domains, reward_terms(cfg)))
rewards = collections.defaultdict(list)
for s in samples:
    rewards[s.task.domain].append(s.score.reward)
batch = {"domains": {d: [len(r) // cfg.train.samples_per_prompt, sum(r) / len(r)] for d, r in rewards.items()},
         "completions": len(samples), "tokens": sum(len(s.completion_ids) for s in samples),
         "digest": hashlib.sha256(json.dumps([s.completion_ids for s in samples]).encode()).hexdigest()[:12]}
times, first = [], {}
for i in range(updates + 1):  # the first: a warm-up, from the weights both trees start with
    t = time.perf_counter()
    built = run.learner.build_batch(samples, cfg.rl.kl_coef)
    stats = run.learner.update(built, cfg.rl.kl_coef, step_generator(cfg.seed, i, 1))
    times.append(time.perf_counter() - t)
    first = first or {k: getattr(stats, k) for k in ("loss", "pg_loss", "kl_mean", "entropy", "clip_frac", "grad_norm")}
print(json.dumps({"times": times[1:], "first": first, "batch": batch}), flush=True)
os._exit(0)  # the run's engine threads are not waited for
"""


def time_tree(tree: Path, recipe: str, overrides: list[str], updates: int, run_dir: str) -> dict:
    """One process's {"times": seconds of each timed update, "first": the warm-up update's metrics,
    "batch": what it trained on}."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", CHILD, recipe, json.dumps(overrides), str(updates), run_dir],
                          cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the timing process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def metric_gaps(base: dict[str, float], new: dict[str, float]) -> list[str]:
    """One line per metric both trees reported: the two values and new - base, relative to |base|
    where base is not 0 (float rounding shows as ~1e-6 relative; a different update as far more).

    >>> metric_gaps({"loss": 2.0, "kl_mean": 0.0}, {"loss": 2.001, "kl_mean": 0.0})
    ['loss: base 2, new 2.001, new - base +1.00e-03 (+5.0e-04 relative)', 'kl_mean: base 0, new 0, new - base +0.00e+00']
    """
    lines = []
    for key in [k for k in base if k in new]:
        b, n = base[key], new[key]
        rel = f" ({(n - b) / abs(b):+.1e} relative)" if b else ""
        lines.append(f"{key}: base {b:.6g}, new {n:.6g}, new - base {n - b:+.2e}{rel}")
    return lines


def describe(batch: dict) -> str:
    """A process's batch in one line: prompts and mean reward per domain, completions, tokens."""
    domains = ", ".join(f"{name} {prompts} prompts (mean reward {reward:.2f})"
                        for name, (prompts, reward) in batch["domains"].items())
    return f"{domains}; {batch['completions']} completions, {batch['tokens']} completion tokens, digest {batch['digest']}"


def report_first(base: dict, new: dict) -> None:
    """Each tree's batch, and the two warm-up updates' metrics side by side (the same batch from
    the same weights: a change that computes the same update differs by float rounding only)."""
    for name, out in (("base", base), ("new", new)):
        print(f"{name} batch: {describe(out['batch'])}")
    same = base["batch"]["digest"] == new["batch"]["digest"]
    print(f"the warm-up update's metrics{'' if same else ' (different batches: not comparable)'}:")
    for line in metric_gaps(base["first"], new["first"]):
        print(f"  {line}")


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    own, overrides = argv[:cut], argv[cut + 1:]
    ap = parser(__doc__)
    ap.add_argument("--base", required=True, help="the commit to compare this working tree with")
    ap.add_argument("--recipe", default="default", help="the recipe both trees load (a built-in name or a path)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--updates", type=int, default=4, help="timed updates a process (after one warm-up)")
    args = ap.parse_args(own)
    bench = Bench(__file__, args)
    tmp = Path(tempfile.mkdtemp(prefix="learner-step-"))
    base = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        got: dict[str, list[float]] = {"base": [], "new": []}
        first: dict[str, dict] = {}
        for r in range(args.rounds):
            for name, tree, extra in (("base", base, []), ("new", ROOT, overrides)):
                out = time_tree(tree, args.recipe, extra, args.updates, str(tmp / f"run-{name}"))
                got[name] += out["times"]
                first.setdefault(name, out)
            if r == 0:
                report_first(first["base"], first["new"])
            print(f"round {r + 1}: base {min(got['base']) * 1e3:.1f} ms, new {min(got['new']) * 1e3:.1f} ms "
                  f"(fastest so far)", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    b, n = min(got["base"]), min(got["new"])
    for name, label, fastest in (("base", f"base {args.base}", b),
                                 ("new", f"new (this tree{', ' + ' '.join(overrides) if overrides else ''})", n)):
        print(f"{label}: {fastest * 1e3:.1f} ms an update at the fastest (build_batch + update), median "
              f"{statistics.median(got[name]) * 1e3:.1f} ms of {len(got[name])}")
    bench.result("learner_step_ratio", f"{n / b:.3f}", target="<=1.05")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
