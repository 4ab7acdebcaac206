"""Every built-in domain, and building the recipe's domains by registry name.

    domains = build_domains(cfg)                      # {key in cfg.domains: Domain}
    d = make_domain("arith", {"levels": [2]}, seed=0)
    available_domains()                               # arith, chat_arith, chat_count, code, sort, rg:...

A recipe's domain is registered under `domains.NAME.type`, or NAME when the type is empty:

    domains:
      arith: {params: {levels: [2]}}                   # the domain `arith`
      arith_hard: {type: arith, params: {levels: [5]}} # a second `arith`, its tasks labelled arith_hard

The recipe's key is the domain's name: its tasks carry it, and it keys weights, reward terms and
metrics. The trainer and the Ray reward actor both build their domains here, the same way. A dataset
entry split by a column (`split_by`, one domain per value) is already one entry per value when it
gets here: the config splits it (`postrl.config.checks.split_domains`), so that every lookup by name
(weights, reward terms, generation limits, sampler processes) sees the same domains.
"""

from __future__ import annotations

from typing import Any

from postrl.abilities import check_abilities
from postrl.config.schema import Config
from postrl.rewards.verifiers import VerifierSettings, make_verifier
from postrl.tasks import arith, chat_arith, chat_count, code, code_retry, dataset, mul, rgym, sort  # noqa: F401  (each registers its domains)
from postrl.tasks.base import DOMAINS, Domain
from postrl.tasks.env import as_environment


def make_domain(type_name: str, params: dict[str, Any] | None = None, seed: int = 0, name: str | None = None) -> Domain:
    """Build the domain registered as `type_name`, named `name` (default: the type). An unknown
    type raises ConfigError naming the valid ones (and the recipe's key, when `name` is given)."""
    key = "" if name is None else f"domains.{name}" if name == type_name else f"domains.{name}.type"
    factory = DOMAINS.get(type_name, key=key)
    domain = factory(dict(params or {}), seed, name or type_name)
    check_abilities(domain, f"domain {name or type_name} (type {type_name})")
    return domain


def available_domains() -> list[str]:
    return DOMAINS.names()


def build_domains(cfg: Config, rm_device: str = "cpu") -> dict[str, Domain]:
    """The recipe's domains, by key. Reward models (`reward_models`) are registered as reward terms
    first, on `rm_device` (the trainer: its model's device; a Ray actor: its GPU, if it was given one):
    a domain's reward terms may name them."""
    if cfg.reward_models:
        from postrl.rewards.models.rm import (
            register_rm_term,  # imports transformers: only for runs that use one
        )

        for term, model_dir in cfg.reward_models.items():
            register_rm_term(term, model_dir, rm_device)
    # a domain given tools or a turn limit becomes an environment (postrl.tasks.env)
    domains = {name: as_environment(make_domain(dcfg.type or name, recipe_params(dcfg.type or name, dcfg.params,
                                                                                 cfg.base_dir), cfg.seed, name), dcfg, name)
               for name, dcfg in cfg.domains.items()}
    for name, dcfg in cfg.domains.items():
        if dcfg.gold:  # scored beside the reward, logged, never trained on (postrl.rewards.scoring)
            domains[name].gold = make_verifier(dcfg.gold, VerifierSettings(base_dir=cfg.base_dir), f"domains.{name}.gold")
    return domains


def recipe_params(type_name: str, params: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """A domain's params as a recipe gives them, plus the recipe's directory for a domain that
    reads files (`uses_base_dir`: relative paths resolve against it) unless they name one."""
    reads_files = type_name in DOMAINS and DOMAINS.facts(type_name).uses_base_dir
    if reads_files and base_dir and "base_dir" not in params:
        return {**params, "base_dir": base_dir}
    return params
