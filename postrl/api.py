"""postrl from Python: `postrl.train` and `postrl.evaluate` (exported lazily by `postrl/__init__.py`).

    import postrl

    def short(prompts, completions, **columns):          # TRL's reward signature
        return [1.0 if len(c) < 200 else 0.0 for c in completions]

    run_dir = postrl.train("recipes/own_data.yaml", overrides=["train.total_steps=2"],
                           reward_funcs=[short], datasets={"gsm": [{"question": "1+1?", "answer": "2"}]})
    scores = postrl.evaluate(run_dir, recipe="recipes/own_data.yaml")   # {domain: {"greedy": ..., ...}}

The same config tree, checks and loop as `postrl train` / `postrl eval --recipe`: a recipe (path or
`Config`) plus dotted overrides; `imports` are loaded first, as the command line's `--import`.

`reward_funcs`: callables `f(prompts, completions, **columns) -> list[float | None]`, each a reward
term for this run named after the function (`postrl.rewards.callable_reward`: in this process, a
thread per call with a deadline; a hang or an exception is a recorded status, never a dead run).
They are TRL's reward functions, called as TRL calls them: None means "does not apply to this
sample" (left out of the sum and of the function's mean; a sample no weighted term applies to is
unverified, zero advantage), and `log_extra` / `log_metric` are given to a function that takes them
(stored with the sample as `reward_logs`, and the metrics `reward_fn/...`).
A domain whose `reward` weights already name a function keeps the recipe's weights; otherwise every
training domain gets the function with its weight from `reward_weights` (TRL's GRPOConfig field:
one per function, default 1), next to its own reward (`reward: 1`) when the recipe gave it none. Under `engine: ray` the reward actor is another process a callable cannot reach: such
a run stops at once with one line (put the function in a module: `imports:` and `register_term`).

`datasets`: {domain: data}, data a path (relative to the working directory), a list of dicts or a
`datasets.Dataset`; it becomes the domain's `params.path` (rows given in memory are written to
`RUN_DIR/data/DOMAIN.jsonl` first, so the saved config names a file a resumed run finds). A domain
the recipe lacks is added as `{type: dataset}`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from postrl.config.checks import validate
from postrl.config.loading import from_dict, parse_override, recipe_imports, set_dotted, to_dict
from postrl.config.schema import Config, DomainConfig, generation_limits
from postrl.errors import UserError
from postrl.extensions import load as load_extensions
from postrl.extensions import load_recipe
from postrl.files import replacing
from postrl.names import check_names
from postrl.rewards.callable_reward import TIMEOUT_S, CallableTerm
from postrl.rewards.terms import OWN_REWARD, TERMS
from postrl.run_dir import check_run_dir, make_run_dir

Recipe = str | Path | Mapping[str, Any] | Config | None


def train(recipe_or_config: Recipe = None, overrides: list[str] = (), reward_funcs: list[Callable] = (),
          datasets: Mapping[str, Any] | None = None, imports: list[str] = (), reward_timeout_s: float = TIMEOUT_S,
          reward_weights: list[float] | None = None, log=print) -> Path:
    """Train as `postrl train` would; returns the run directory (the trained model in final/).
    `reward_timeout_s`: the deadline of one call of a reward function (one prompt's group);
    `reward_weights`: one weight per reward function (default 1 each)."""
    from postrl.loop import train as run_loop

    cfg = to_config(recipe_or_config, overrides, imports)
    if reward_weights is not None and len(reward_weights) != len(reward_funcs):
        raise UserError(f"reward_weights: {len(reward_weights)} weights for {len(reward_funcs)} reward functions; "
                        "give one per function")
    terms = [CallableTerm(f, reward_timeout_s) for f in reward_funcs]
    taken = [t.name for t in terms if t.name in TERMS or t.name == OWN_REWARD]
    if taken or len({t.name for t in terms}) < len(terms):
        raise UserError(f"reward_funcs: two functions, or a function and a reward term, share the name "
                        f"{(taken or [t.name for t in terms])[0]!r}; rename the function")
    if terms and cfg.engine == "ray":
        raise UserError("reward_funcs: a Python callable lives in this process, and under engine: ray rewards "
                        "are computed by a Ray actor it cannot reach; put it in a module named in `imports:` "
                        "(@register_term) or use verifier python:MODULE:FUNCTION")
    if cfg.run.dir:  # a run there: refused now, before the rows for `datasets` are written
        check_run_dir(Path(cfg.run.dir), cfg.run.overwrite)
    made = attach_datasets(cfg, datasets or {}, log)
    try:
        weigh_terms(cfg, [t.name for t in terms], reward_weights)
        for term in terms:
            TERMS.add(term.name, term)
        validate(cfg)
        return run_loop(cfg, log=log)
    except BaseException:
        if made is not None and made.exists() and not (made / "config.yaml").exists():
            shutil.rmtree(made / "data", ignore_errors=True)  # nothing was trained: the rows written for it go
            if not any(made.iterdir()):
                made.rmdir()
        raise
    finally:
        for term in terms:
            TERMS.remove(term.name)


def evaluate(model: str | Path, recipe: Recipe = None, overrides: list[str] = (), domains: list[str] | None = None,
             imports: list[str] = (), log=print) -> dict[str, dict[str, float]]:
    """Held-out greedy accuracy and pass@k of `model` (a model directory, a run directory, or a
    built-in name) on the recipe's domains and eval-only domains, with their parameters and
    generation limits, as `postrl eval MODEL --recipe RECIPE`; `domains` picks some of them.
    Without a recipe, `domains` are built-in domains with their default parameters."""
    from postrl.builtin_models import load_model
    from postrl.evaluation import evaluate as evaluate_policy
    from postrl.model.device import resolve_device
    from postrl.sampling.policy import Policy
    from postrl.tasks.catalog import build_domains

    cfg = to_config(recipe, overrides, imports)
    if recipe is None and domains:
        cfg.domains = {name: DomainConfig() for name in domains}
    for d in cfg.domains.values():  # eval counts verdicts, not rewards: a run's own terms may be gone
        d.reward = {}
    check_names(cfg)
    built = pick(build_domains(cfg) | build_domains(dataclasses.replace(cfg, domains=cfg.eval.domains)), domains)
    model_dir, e = model_path(model), cfg.eval
    device = resolve_device(cfg.run.device)  # cuda asked for and absent: an error before the model loads
    net, tok = load_model(model_dir, log=log)
    return evaluate_policy(
        Policy(net.to(device), tok, rollout=cfg.rollout), built, num_problems=e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
        temperature=e.temperature, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed,
        limits={name: generation_limits(cfg, name) for name in built},
    )


# ---------------------------------------------------------------------------- helpers


def to_config(recipe: Recipe, overrides: list[str], imports: list[str]) -> Config:
    """A recipe path (or None: the defaults) loaded with its imports; a recipe's mapping, or a
    `Config` (a recipe already parsed), copied, its imports loaded, the overrides applied, checked."""
    if isinstance(recipe, (str, Path)) or recipe is None:
        return load_recipe(recipe, list(overrides), list(imports))
    raw = to_dict(recipe) if isinstance(recipe, Config) else copy.deepcopy(dict(recipe))
    for item in overrides:
        set_dotted(raw, *parse_override(item))
    raw["imports"] = recipe_imports(raw, list(imports))
    load_extensions(raw["imports"])
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def weigh_terms(cfg: Config, names: list[str], weights: list[float] | None = None) -> None:
    """Each callable joins every training domain's reward with its weight (`weights`, one per name;
    default 1), next to the domain's own reward when the recipe weighted none, unless some domain's
    recipe weights already name it."""
    named = {term for d in cfg.domains.values() for term in d.reward}
    for name, weight in zip(names, weights if weights is not None else [1.0] * len(names)):
        if name in named:
            continue
        for d in cfg.domains.values():
            d.reward = {**(d.reward or {OWN_REWARD: 1.0}), name: float(weight)}


def attach_datasets(cfg: Config, datasets: Mapping[str, Any], log=print) -> Path | None:
    """Point each domain's `params.path` at its data (see the module docstring). Returns the run
    directory when rows had to be written into it (it is then fixed now, and a run it held moved
    aside with run.overwrite, before the rows go in), else None."""
    made = None
    for name, data in datasets.items():
        domain = cfg.domains.setdefault(name, DomainConfig(type="dataset"))
        if isinstance(data, (str, Path)):
            domain.params["path"] = str(Path(data).resolve())
            continue
        made = made or make_run_dir(cfg, resume=False, log=log)
        domain.params["path"] = str(write_jsonl(data, made / "data" / f"{name}.jsonl").resolve())
    return made


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """A list of dicts or a `datasets.Dataset` (both iterate over dict rows) as JSON lines."""
    from postrl.tasks.dataset_files import json_safe

    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:  # a resumed run reads it back: whole or not at all
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise UserError(f"datasets: row {i} is a {type(row).__name__}, expected a dict of columns")
            f.write(json.dumps(json_safe(dict(row))) + "\n")
    return path


def pick(built: dict, names: list[str] | None) -> dict:
    if not names:
        return built
    unknown = [n for n in names if n not in built]
    if unknown:
        raise UserError(f"domains {unknown}: not in the recipe's domains or eval.domains ({', '.join(built)})")
    return {n: built[n] for n in names}


def model_path(model: str | Path) -> str:
    """A run directory stands for its final/ model."""
    final = Path(model) / "final"
    return str(final) if (final / "config.json").is_file() else str(model)
