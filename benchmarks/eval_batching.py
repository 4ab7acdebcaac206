"""The in-run held-out evaluation of several domains: one batch for all of them against one per domain.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/eval_batching.py [--recipe R] [--problems 12] [--repeats 2]

A multi-domain run evaluates every few steps on a few problems a domain (recipes/smollm2-joint.yaml:
12 problems of each of four domains, one greedy reply and one sample each). Decoding is bound by the
number of token steps, not by the rows in them: on 2 CPU cores a SmolLM2-135M decode step of 12 rows
costs about half of one of 48. `postrl.evaluation.evaluate` samples every single-turn domain's
greedy and sampled replies in one batch, each row with its own token limit and stop strings;
before, `evaluate_domain` ran each domain alone, a greedy call then a sampled one.

Both arms run side by side on the same loaded model, alternating (`--repeats` rounds), on the
recipe's held-out problems with its eval settings and per-domain limits. Greedy accuracy must agree
(greedy replies do not depend on the batch); the sampled replies are drawn in another order, so
pass@1 agrees only up to sampling noise. Prints each arm's seconds and the ratio:

    RESULT eval_speedup=<per-domain seconds / one-batch seconds> target=1.5
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from _harness import Bench, load_avg, parser, timed  # benchmarks/, on the path when this script runs

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.config.schema import generation_limits
from postrl.evaluation import evaluate, evaluate_domain
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import build_domains

TARGET = 1.5


def main(argv: list[str]) -> int:
    ap = parser(__doc__)
    ap.add_argument("--recipe", default="recipes/smollm2-joint.yaml")
    ap.add_argument("--problems", type=int, default=0, help="held-out problems a domain (default: the recipe's eval)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of both arms, alternating")
    args = ap.parse_args(argv)
    bench = Bench(__file__, args)
    cfg = load_config(args.recipe, [])
    domains = build_domains(cfg) | build_domains(dataclasses.replace(cfg, domains=cfg.eval.domains))
    limits = {name: generation_limits(cfg, name) for name in domains}
    e = cfg.eval
    kw = dict(num_problems=args.problems or e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
              temperature=e.temperature, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed)
    policy = Policy(*load_model(cfg.model.name, cfg.model.dtype, log=lambda *_: None))
    print(f"{args.recipe}: {', '.join(domains)}; {kw['num_problems']} problems a domain, "
          f"{kw['samples_per_problem']} sample(s) + greedy each; load {load_avg():.2f}", flush=True)

    def per_domain() -> dict:
        return {name: evaluate_domain(policy, d, **(kw | dict(zip(("max_new_tokens", "stop"), limits[name]))))
                for name, d in domains.items()}

    def together() -> dict:
        return evaluate(policy, domains, limits, **kw)

    times: dict[str, list[float]] = {"per domain": [], "one batch": []}
    results = {}
    for _ in range(args.repeats):
        for name, arm in (("per domain", per_domain), ("one batch", together)):
            with timed() as t:
                results[name] = arm()
            times[name].append(t.seconds)
            print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
    try:
        for name in domains:
            a, b = results["per domain"][name], results["one batch"][name]
            print(f"{name}: greedy {a['greedy']:.3f} / {b['greedy']:.3f}, pass@1 {a['pass@1']:.3f} / {b['pass@1']:.3f}")
            if a["greedy"] != b["greedy"]:
                print(f"  greedy differs on {name}: the batch changed a greedy reply")
    finally:
        for d in domains.values():
            getattr(d, "close", lambda: None)()
    slow, fast = statistics.median(times["per domain"]), statistics.median(times["one batch"])
    print(f"median of {args.repeats}: per domain {slow:.1f} s, one batch {fast:.1f} s; load {load_avg():.2f}")
    bench.result("eval_speedup", f"{slow / fast:.2f}", target=TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
