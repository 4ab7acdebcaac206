"""postrl train [RECIPE.yaml] [dotted.key=value ...] [--import MODULE_OR_FILE]  |  postrl train --resume RUN_DIR [overrides]"""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="RL post-training from a recipe", description=__doc__)
    p.add_argument("recipe", nargs="?", help="a YAML recipe file, or a built-in recipe by name (default, multidomain, ...); none: the built-in defaults")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.kl_coef=0.02")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest intact checkpoint")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module (name or .py file) that registers domains, verifiers, reward terms "
                        "or monitors; loaded before the recipe is checked (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.extensions import load_recipe
    from postrl.loop import resume_config, train
    from postrl.run_dir import check_run_dir

    recipe, overrides = args.recipe, list(args.overrides)
    if recipe is not None and "=" in recipe and not recipe.endswith((".yaml", ".yml")):
        recipe, overrides = None, [recipe, *overrides]  # `postrl train key=value` without a recipe
    if args.resume:
        if recipe is not None:
            overrides = [recipe, *overrides]
        train(resume_config(args.resume, overrides, args.imports), resume=True)
    else:
        cfg = load_recipe(recipe, overrides, args.imports)
        if cfg.run.dir:  # a run there: refused at once, not after the model has loaded
            check_run_dir(Path(cfg.run.dir), cfg.run.overwrite)
        train(cfg)
    return 0
