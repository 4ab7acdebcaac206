"""Train SmolLM2-135M-Instruct on your own JSONL math data, and measure what it gained.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/own_data_gain.py [RECIPE] [dotted.key=value ...]

The recipe (default recipes/smollm2-gsm.yaml) names a `dataset` domain on GSM8K-format JSONL
(question, and an answer ending in `#### N`), graded by the math verifier with chain of thought,
and an eval-only control domain (`eval.domains`) that is never trained on.

1. held-out pass@1 (and greedy, pass@k) of the base model on every trained domain's held-out file
   and every control domain, problem by problem;
2. trains with postrl's own loop (`postrl.loop.train`) as the recipe says;
3. the trained policy from the run's `final/` directory, measured again on the same problems with
   the same sampling seeds;
4. the table with +/- 2 paired standard errors (benchmarks/_gain.py), then
   `RESULT pass@1_gain=<points> target=0.05`.

Targets (issue 15): +5 points or more on the trained set, and more than 2 SE above base; no drop
beyond 2 SE on the control; at most 90 minutes on 2 CPU cores, evaluation included.
"""

from __future__ import annotations

import dataclasses
import sys

from _gain import measure, report  # benchmarks/, on the path when this script runs
from _harness import Bench, Timed, parse_recipe_args, parser

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.loop import train
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import build_domains

TARGET_GAIN = 0.05
TARGET_MINUTES = 90


def suites_of(cfg) -> tuple[dict, set[str]]:
    """{domain: (Domain, held-out tasks)} for the trained and the eval-only domains, built as a run
    builds them; the trained names."""
    domains = build_domains(cfg) | build_domains(dataclasses.replace(cfg, domains=cfg.eval.domains))
    return {name: (d, d.heldout(cfg.eval.num_problems)) for name, d in domains.items()}, set(cfg.domains)


def max_new_tokens(cfg) -> dict[str, int]:
    """Each domain's own max_new_tokens where its recipe entry sets one."""
    out = {}
    for name, dcfg in [*cfg.domains.items(), *cfg.eval.domains.items()]:
        tokens = getattr(dcfg, "max_new_tokens", 0) or dcfg.params.get("max_new_tokens", 0)
        if tokens:
            out[name] = tokens
    return out


def main(argv: list[str]) -> int:
    args, recipe, overrides = parse_recipe_args(parser(__doc__), argv, "recipes/smollm2-gsm.yaml")
    benchmark = Bench(__file__, args)
    bench = load_config(recipe, overrides)
    # the loop's own evals are kept tiny: this script measures before and after itself
    cfg = load_config(recipe, overrides + ["eval.num_problems=4", "eval.samples_per_problem=1", "eval.k=[1]",
                                           "eval.domains={}", "run.progress=false"])
    suites, trained = suites_of(bench)
    tokens = max_new_tokens(bench)
    print(f"base model {cfg.model.name}:", flush=True)
    base = measure(Policy(*load_model(cfg.model.name, cfg.model.dtype, log=lambda *_: None)), suites, bench, tokens)
    training = Timed()
    run_dir = train(cfg, log=lambda *_: None)
    print(f"trained {cfg.train.total_steps} steps in {training.seconds:.0f} s -> {run_dir}; trained policy {run_dir / 'final'}:")
    after = measure(Policy(*load_model(str(run_dir / "final"), cfg.model.dtype, log=lambda *_: None)), suites, bench,
                    tokens)
    minutes = benchmark.clock.seconds / 60
    changes = report(base, after, bench, trained, run_dir, minutes * 60)
    name = sorted(trained)[0]
    gain, se = changes[name]
    print(f"{name}: gain {gain:+.3f} is {'more' if gain > 2 * se else 'NOT more'} than 2 SE ({2 * se:.3f}); "
          f"{minutes:.1f} min of {TARGET_MINUTES}")
    benchmark.result("pass@1_gain", f"{gain:.3f}", target=f"{TARGET_GAIN:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
