"""The config checks that span fields, run once by `load_config` after the tree is built.

Each field's own type, choices and range are checked as it loads (`postrl.config.loading.from_dict`);
what is here needs two or more fields at once (a minibatch count that must divide the completions
of a step, a buffer that must fit the generation budget, ...). A domain entry split by a column
becomes its domains here (`split_domains`), so every part of the run sees them.
"""

from __future__ import annotations

import copy

from postrl.config.schema import Config, DomainConfig
from postrl.errors import ConfigError


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express (each field's own choices and range are
    checked as it loads: `from_dict`). Keys whose value names a registered thing (a loss, a domain,
    a schedule, ...) are checked against their registries by `postrl.names.check_names`, which
    knows the registries; this module knows none. A domain entry split by a column becomes its
    domains here (`split_domains`), so every part of the run sees them."""
    cfg.domains, cfg.eval.domains = split_domains(cfg.domains, "domains"), split_domains(cfg.eval.domains, "eval.domains")
    t = cfg.train
    completions = t.prompts_per_step * t.samples_per_prompt
    if completions % t.minibatches:
        raise ConfigError(
            f"config key 'train.minibatches' = {t.minibatches}: must divide the "
            f"{completions} completions per step"
        )
    if t.shard != "none" and t.learners < 2:
        raise ConfigError(f"config key 'train.shard' = {t.shard!r}: shards across learner ranks; set "
                          f"train.learners to 2 or more (it is {t.learners})")
    if not cfg.domains:
        raise ConfigError("config key 'domains' is empty: name at least one domain")
    if any(k > cfg.eval.samples_per_problem for k in cfg.eval.k):
        raise ConfigError(
            f"config key 'eval.k' = {cfg.eval.k}: every k must be <= eval.samples_per_problem "
            f"({cfg.eval.samples_per_problem})"
        )
    validate_curriculum(cfg)
    validate_pipeline(cfg)
    validate_domains(cfg)
    validate_overlong(cfg)


def validate_domains(cfg: Config) -> None:
    both = sorted(set(cfg.domains) & set(cfg.eval.domains))
    if both:
        raise ConfigError(f"config key 'eval.domains.{both[0]}': already a training domain (domains.{both[0]})")


def validate_overlong(cfg: Config) -> None:
    """The soft overlong penalty ramps up to train.max_new_tokens, the one budget the learner knows."""
    buffer, limit = cfg.rl.overlong_buffer, cfg.train.max_new_tokens
    if buffer > limit:
        raise ConfigError(f"config key 'rl.overlong_buffer' = {buffer}: must be <= train.max_new_tokens ({limit})")
    own = [(name, d.max_new_tokens) for name, d in cfg.domains.items() if d.max_new_tokens not in (0, limit)]
    if buffer and own:
        raise ConfigError(f"config key 'rl.overlong_buffer' ramps up to train.max_new_tokens ({limit}); "
                          f"domains.{own[0][0]}.max_new_tokens = {own[0][1]} is another budget")


def split_domains(domains: dict[str, DomainConfig], prefix: str) -> dict[str, DomainConfig]:
    """Each entry whose params hold `split_by: COLUMN` and `verifiers: {VALUE: spec}` (one file,
    several tasks: verl's `data_source`) as one entry per value, named `NAME/VALUE`, in the order
    given: the entry's settings, its weight shared equally, its params with the value's own laid
    over them (a spec is a verifier name, or a mapping of params such as {verifier, extract, answer})
    and `split_value` / `split_values`, which the dataset domain reads to keep its rows. An entry
    already split (it has `split_value`) is kept, so splitting twice changes nothing."""
    if not any(d.params.get("split_by") and "split_value" not in d.params for d in domains.values()):
        return domains
    out: dict[str, DomainConfig] = {}
    for name, d in domains.items():
        if not d.params.get("split_by") or "split_value" in d.params:
            out[name] = d
            continue
        key, per_value = f"{prefix}.{name}.params", d.params.get("verifiers")
        if not isinstance(per_value, dict) or not per_value:
            raise ConfigError(f"config key '{key}.verifiers': split_by needs a verifier per value, "
                              f"e.g. {{openai/gsm8k: math, other: exact}}")
        if "verifier" in d.params:
            raise ConfigError(f"config key '{key}.verifier': with split_by, name the verifiers per value (verifiers)")
        shared = {k: v for k, v in d.params.items() if k != "verifiers"}
        for value, spec in per_value.items():
            if not isinstance(spec, (str, dict)) or not spec:
                raise ConfigError(f"config key '{key}.verifiers.{value}': expected a verifier name or a mapping of params")
            part = copy.deepcopy(d)
            part.type, part.weight = d.type or name, d.weight / len(per_value)
            part.params = {**copy.deepcopy(shared), **({"verifier": spec} if isinstance(spec, str) else spec),
                           "split_value": str(value), "split_values": [str(v) for v in per_value]}
            if f"{name}/{value}" in domains:
                raise ConfigError(f"config key '{prefix}.{name}/{value}': already a domain; {name} split by "
                                  f"{d.params['split_by']} names it too")
            out[f"{name}/{value}"] = part
    return out


def validate_pipeline(cfg: Config) -> None:
    p, r = cfg.pipeline, cfg.ray
    if r.max_sandbox_actors < r.sandbox_actors:
        raise ConfigError(f"config key 'ray.max_sandbox_actors' = {r.max_sandbox_actors}: must be >= "
                          f"ray.sandbox_actors ({r.sandbox_actors})")
    if p.samplers and (cfg.engine != "local" or p.source):
        raise ConfigError("config key 'pipeline.samplers': sampler processes are engine local's; "
                          "engine ray samples on its rollout actors (ray.rollout_workers)")
    if cfg.pipeline.source and (cfg.engine != "local" or cfg.pipeline.max_staleness or cfg.curriculum.dynamic_sampling):
        raise ConfigError("config key 'pipeline.source': replay runs with engine local, max_staleness 0 "
                          "and no dynamic sampling (stored batches are replayed as they are)")


def validate_curriculum(cfg: Config) -> None:
    c = cfg.curriculum
    if not 0 <= c.domain_floor * len(cfg.domains) <= 1:
        raise ConfigError(
            f"config key 'curriculum.domain_floor' = {c.domain_floor}: must be in [0, 1/{len(cfg.domains)}] "
            f"for {len(cfg.domains)} domains"
        )
