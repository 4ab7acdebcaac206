"""Does RL make SmolLM2-135M-Instruct better at arithmetic, without hurting something else?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/smollm2_gain.py [RECIPE] [dotted.key=value ...]

1. held-out pass@1 / pass@8 (and greedy) of the base model on the recipe's domain
   (recipes/smollm2-arith.yaml: chat_arith) and on a second domain it is *not* trained on
   (chat_count: reasoning-gym letter counting, graded by the same last-integer rule);
2. trains with postrl's own loop (`postrl.loop.train`) as the recipe says;
3. loads the trained policy from the run's `final/` directory (the merged LoRA checkpoint, as
   `AutoModelForCausalLM.from_pretrained` sees it) and measures both domains again, on the same
   problems with the same sampling seeds;
4. prints the table and `RESULT pass@1_gain=<points> target=0.10`.

Noise: paired standard errors, see benchmarks/_gain.py. Not a test: it takes about an hour
on 2 cores.
"""

from __future__ import annotations

import sys

from _gain import measure, report  # benchmarks/, on the path when this script runs
from _harness import Bench, Timed, parse_recipe_args, parser

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.loop import train
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import make_domain

SECOND_DOMAIN = ("chat_count", {"levels": [0]})  # held out: half as many problems as the trained domain

TARGET_GAIN = 0.10


def main(argv: list[str]) -> int:
    args, recipe, overrides = parse_recipe_args(parser(__doc__), argv, "recipes/smollm2-arith.yaml")
    benchmark = Bench(__file__, args)
    # the loop's own end-of-run eval is kept tiny: this script measures before and after itself
    cfg = load_config(recipe, overrides + ["eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false"])
    bench = load_config(recipe, overrides)
    [(train_name, dcfg)] = cfg.domains.items()
    suites = {
        train_name: (d := make_domain(train_name, dcfg.params, cfg.seed), d.heldout(bench.eval.num_problems)),
        SECOND_DOMAIN[0]: (d2 := make_domain(*SECOND_DOMAIN, cfg.seed), d2.heldout(bench.eval.num_problems // 2)),
    }
    print(f"base model {cfg.model.name}:", flush=True)
    base = measure(Policy(*load_model(cfg.model.name, cfg.model.dtype, log=lambda *_: None)), suites, bench)
    training = Timed()
    run_dir = train(cfg, log=lambda *_: None)
    print(f"trained {cfg.train.total_steps} steps in {training.seconds:.0f} s -> {run_dir}; trained policy {run_dir / 'final'}:")
    after = measure(Policy(*load_model(str(run_dir / "final"), cfg.model.dtype, log=lambda *_: None)), suites, bench)
    changes = report(base, after, bench, {train_name}, run_dir, benchmark.clock.seconds)
    benchmark.result("pass@1_gain", f"{changes[train_name][0]:.3f}", target=f"{TARGET_GAIN:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
