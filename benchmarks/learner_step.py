"""The learner's step time at two commits, side by side: did a change slow the update down?

    .venv/bin/python benchmarks/learner_step.py --base 1c0374e            # that commit vs this working tree
    .venv/bin/python benchmarks/learner_step.py --base 1c0374e -- rl.advantage=gae critic.model=policy

Each tree runs its own code in its own process (`cwd` and `PYTHONPATH` set to it; the base is a
`git worktree` of `--base`, made and removed here): the default recipe's model and one step's batch
(prompts_per_step x samples_per_prompt completions, sampled with a fixed seed, the same in both
trees), then `Learner.build_batch` + `Learner.update` timed `--updates` times after one warm-up,
one torch thread. The two trees alternate `--rounds` times, so load on the shared machine falls on
both alike, and each tree's fastest update is compared (load only ever adds time; the medians are
printed beside them). Overrides after `--` apply to
the new tree only (to time an objective the base does not have, against the base's default).

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
import json, os, sys, time, torch
from postrl.config.loading import load_config
from postrl.engines.orders import attach_scores, reward_terms, score_chunk
from postrl.run import open_run
from postrl.sampling.generate import GenParams
from postrl.seeding import step_generator
overrides, updates, run_dir = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = load_config("default", [f"run.dir={run_dir}", "run.overwrite=true", "run.progress=false", "run.threads=1",
                              *overrides])
run = open_run(cfg, log=lambda *a: None)
tasks = run.sampler.next_batch(cfg.train.prompts_per_step, {n: d.weight for n, d in cfg.domains.items()})
gen = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
samples = run.policy.sample(tasks, cfg.train.samples_per_prompt, gen, step_generator(cfg.seed, 0, 0))
attach_scores(samples, score_chunk(samples, run.domains, reward_terms(cfg)))
times = []
for i in range(updates + 1):  # the first: a warm-up
    t = time.perf_counter()
    batch = run.learner.build_batch(samples, cfg.rl.kl_coef)
    run.learner.update(batch, cfg.rl.kl_coef, step_generator(cfg.seed, i, 1))
    times.append(time.perf_counter() - t)
print(json.dumps(times[1:]), flush=True)
os._exit(0)  # the run's engine threads are not waited for
"""


def time_tree(tree: Path, overrides: list[str], updates: int, run_dir: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(overrides), str(updates), run_dir],
                          cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the timing process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    own, overrides = argv[:cut], argv[cut + 1:]
    ap = parser(__doc__)
    ap.add_argument("--base", required=True, help="the commit to compare this working tree with")
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
        for r in range(args.rounds):
            for name, tree, extra in (("base", base, []), ("new", ROOT, overrides)):
                got[name] += time_tree(tree, extra, args.updates, str(tmp / f"run-{name}"))
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
