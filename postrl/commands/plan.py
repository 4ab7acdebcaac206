"""postrl plan RECIPE [overrides]: print the effective batch arithmetic and exit."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="print the batch arithmetic of a recipe", description=__doc__)
    p.add_argument("recipe", nargs="?")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module (name or .py file) that registers domains, verifiers, reward terms "
                        "or monitors; loaded before the recipe is checked (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.extensions import load_recipe
    from postrl.names import check_names

    cfg = load_recipe(args.recipe, args.overrides, args.imports)
    check_names(cfg)
    t = cfg.train
    completions = t.prompts_per_step * t.samples_per_prompt
    per_mb = completions // t.minibatches
    lines = [
        f"domains                {', '.join(f'{n} (weight {d.weight:g})' for n, d in cfg.domains.items())}",
        f"prompts per step       {t.prompts_per_step}",
        f"samples per prompt     {t.samples_per_prompt}",
        f"completions per step   {t.prompts_per_step} x {t.samples_per_prompt} = {completions}",
        f"tokens per step        <= {completions} x {t.max_new_tokens} = {completions * t.max_new_tokens} new tokens",
        f"minibatch              {completions} / {t.minibatches} = {per_mb} completions",
        f"optimiser steps/batch  {t.ppo_epochs} epochs x {t.minibatches} minibatches = {t.ppo_epochs * t.minibatches}",
        f"total                  {t.total_steps} steps, {t.total_steps * completions} completions, "
        f"{t.total_steps * t.ppo_epochs * t.minibatches} optimiser steps",
    ]
    print("\n".join(lines))
    return 0
