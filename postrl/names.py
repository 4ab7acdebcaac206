"""Every config key whose value names a registered thing, checked against its registry in one place.

    check_names(cfg)   # ConfigError, one line naming the key and the valid names

`NAMED_KEYS` is the table: a key pattern and the registry its values must name. `NAME` in a
pattern stands for each domain (`domains.NAME`) or each monitor (`monitor.NAME`), `TERM` for each
reward term a domain weights. The run, `postrl plan` and `postrl eval RECIPE` call `check_names`
before they create a directory or load a model, so a misspelt name costs nothing. `postrl.config`
checks types and ranges and knows no registry; this module knows them all, and builds nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from postrl.algo.advantages import ADVANTAGES
from postrl.algo.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, LOSSES
from postrl.config.schema import Config, DomainConfig
from postrl.curriculum.schedule import SCHEDULES
from postrl.engines.registry import ENGINES
from postrl.engines.replay import PREFIX as REPLAY
from postrl.errors import ConfigError
from postrl.evaluation import EVAL_AGGREGATES
from postrl.monitor.alerts import ALERT_ACTIONS
from postrl.monitor.monitors import MONITORS  # its import registers the built-in monitors
from postrl.monitor.settings import HELDOUT_AUTO
from postrl.monitor.sinks import SINKS
from postrl.registry import Registry
from postrl.rewards.composite import TERMS  # from composite: its import registers the built-in terms
from postrl.rewards.extract import ExtractorNames
from postrl.rewards.terms import OWN_REWARD
from postrl.rewards.verifiers import VerifierNames
from postrl.sampling.backends import SAMPLING_BACKENDS, check_backend
from postrl.store.rollouts import shard_steps
from postrl.tasks.catalog import DOMAINS  # its import registers the built-in domains and verifiers
from postrl.tools.base import TOOLS  # the built-in tools are registered by the catalog's import (tasks.env)
from postrl.tools.formats import AUTO, TOOL_FORMATS


class Names(Protocol):
    """What a key's values are checked against: a Registry, or anything that checks like one."""

    def check(self, name: str, key: str = "") -> None: ...


@dataclass(frozen=True)
class NamedKey:
    pattern: str
    """The config key; NAME stands for each domain or monitor, TERM for each reward term."""
    registry: Callable[[Config, str], Names]
    """The registry the key's values must name, given the config and the NAME matched ('' if none)."""
    values: Callable[[Config], list[tuple[str, str, str]]] | None = None
    """(key as written, value, NAME) for each value; None: the value at `pattern`, each entry of a list."""


def domain_types(cfg: Config) -> list[tuple[str, str, str]]:
    """A domain's registry name is its `type`, or its key when the type is empty."""
    return [(f"domains.{n}.type", d.type, n) if d.type else (f"domains.{n}", n, n) for n, d in cfg.domains.items()]


def eval_domain_types(cfg: Config) -> list[tuple[str, str, str]]:
    """`eval.domains` (eval-only) name their types as `domains` do."""
    return [(f"eval.domains.{n}.type", d.type, n) if d.type else (f"eval.domains.{n}", n, n)
            for n, d in cfg.eval.domains.items()]


def reward_terms(cfg: Config) -> list[tuple[str, str, str]]:
    return [(f"domains.{n}.reward.{term}", term, n) for n, d in cfg.domains.items() for term in d.reward]


def domain_params(param: str) -> Callable[[Config], list[tuple[str, str, str]]]:
    """Every domain's (trained or eval-only) non-empty `params.<param>`, e.g. a dataset's verifier."""

    def values(cfg: Config) -> list[tuple[str, str, str]]:
        domains = [(f"domains.{n}", d) for n, d in cfg.domains.items()]
        domains += [(f"eval.domains.{n}", d) for n, d in cfg.eval.domains.items()]
        return [(params_key(key, d, param), d.params[param], key.rsplit(".", 1)[1])
                for key, d in domains if isinstance(d.params.get(param), str) and d.params[param]]

    return values


def params_key(key: str, d, param: str) -> str:
    """`KEY.params.PARAM`; for a domain made by splitting a file (`split_by`, `postrl.config.checks.split_domains`),
    the entry the recipe wrote: `domains.NAME.params.verifiers.VALUE` for its verifier."""
    value = d.params.get("split_value")
    if isinstance(value, str) and value and key.endswith(f"/{value}"):
        parent = key[: -len(value) - 1]
        return f"{parent}.params.verifiers.{value}" if param == "verifier" else f"{parent}.params.{param}"
    return f"{key}.params.{param}"


def domain_golds(cfg: Config) -> list[tuple[str, str, str]]:
    """Every domain's monitoring-only `gold` scorer, a verifier spec."""
    return [(f"domains.{n}.gold", d.gold, n) for n, d in cfg.domains.items() if d.gold]


def all_domains(cfg: Config) -> list[tuple[str, DomainConfig]]:
    """(key, entry) of every domain, trained (`domains.NAME`) or eval-only (`eval.domains.NAME`)."""
    return [(f"domains.{n}", d) for n, d in cfg.domains.items()] + \
        [(f"eval.domains.{n}", d) for n, d in cfg.eval.domains.items()]


def domain_tools(cfg: Config) -> list[tuple[str, str, str]]:
    """Every tool a domain (trained or eval-only) names in `tools:`."""
    return [(f"{key}.tools", tool, key.rsplit(".", 1)[1]) for key, d in all_domains(cfg) for tool in d.tools]


def domain_tool_formats(cfg: Config) -> list[tuple[str, str, str]]:
    """Every domain's (trained or eval-only) `tool_format`."""
    return [(f"{key}.tool_format", d.tool_format, key.rsplit(".", 1)[1]) for key, d in all_domains(cfg)]


def tool_format_settings(cfg: Config, domain: str) -> Registry:
    """What `tool_format` may name: auto (from the chat template) or a registered format."""
    valid = Registry("tool format")
    for name in (AUTO, *TOOL_FORMATS.names()):
        valid.add(name, None)
    return valid


def heldout_gold_domains(cfg: Config) -> list[tuple[str, str, str]]:
    """Each entry of `monitor.proxy_gold.heldout_domains`, keyed by its index."""
    key = "monitor.proxy_gold.heldout_domains"
    return [(f"{key}[{i}]", name, "") for i, name in enumerate(cfg.monitor.proxy_gold.heldout_domains)]


class HeldoutGoldDomains:
    """What `monitor.proxy_gold.heldout_domains` may name: `auto`, or an eval-only domain, read from an
    eval of every step (eval.every_steps 1): evaluated less often, most steps would have no eval."""

    def __init__(self, cfg: Config):
        self.every_steps = cfg.eval.every_steps
        self.valid = Registry("eval-only domain")
        for name in (HELDOUT_AUTO, *cfg.eval.domains):
            self.valid.add(name, None)

    def check(self, name: str, key: str = "") -> None:
        self.valid.check(name, key)
        if name != HELDOUT_AUTO and self.every_steps != 1:
            raise ConfigError(f"config key '{key}' = {name!r}: held-out gold is read from an eval of every step; "
                              f"set eval.every_steps: 1 (now {self.every_steps})")


def monitor_actions(cfg: Config) -> list[tuple[str, str, str]]:
    return [(f"monitor.{n}.action", getattr(cfg.monitor, n).action, n) for n in MONITORS.names()]


def terms_of(cfg: Config, domain: str) -> Registry:
    """The terms domain `domain` may weight: the components its verifier's scores carry, the
    registered terms, the run's reward models, and `reward` (the domain's own)."""
    components = DOMAINS.facts(cfg.domains[domain].type or domain).components
    valid = Registry("reward term")
    for name in {OWN_REWARD, *TERMS.names(), *cfg.reward_models, *components}:
        valid.add(name, None)
    return valid


class RolloutSources:
    """`pipeline.source`: '' (sample live) or 'replay:RUN_DIR', a run directory with stored rollouts."""

    def check(self, name: str, key: str = "") -> None:
        if not name:
            return
        if not name.startswith(REPLAY):
            raise ConfigError(f"config key '{key}' = {name!r}: expected '' (sample live) or '{REPLAY}RUN_DIR'")
        path = Path(name[len(REPLAY):])
        if not shard_steps(path):
            raise ConfigError(f"config key '{key}' = {name!r}: no rollouts under {path / 'rollouts'}; "
                              f"expected '{REPLAY}RUN_DIR' of a run that stored them")


class SamplingBackends:
    """`rollout.backend`: a registered backend that can run here (`BackendFacts.problem`)."""

    def check(self, name: str, key: str = "") -> None:
        check_backend(name, key or SAMPLING_BACKENDS.key)


NAMED_KEYS: list[NamedKey] = [
    NamedKey("engine", lambda cfg, _: ENGINES),
    NamedKey("rollout.backend", lambda cfg, _: SamplingBackends()),
    NamedKey("rl.advantage", lambda cfg, _: ADVANTAGES),
    NamedKey("rl.loss", lambda cfg, _: LOSSES),
    NamedKey("rl.kl_estimator", lambda cfg, _: KL_ESTIMATORS),
    NamedKey("rl.loss_agg", lambda cfg, _: LOSS_AGGREGATIONS),
    NamedKey("curriculum.schedule", lambda cfg, _: SCHEDULES),
    NamedKey("eval.seesaw_action", lambda cfg, _: ALERT_ACTIONS),
    NamedKey("eval.best_aggregate", lambda cfg, _: EVAL_AGGREGATES),
    NamedKey("domains.NAME.type", lambda cfg, _: DOMAINS, domain_types),
    NamedKey("domains.NAME.reward.TERM", terms_of, reward_terms),  # after the types: it reads them
    NamedKey("domains.NAME.params.verifier", lambda cfg, _: VerifierNames(cfg.base_dir), domain_params("verifier")),
    NamedKey("domains.NAME.params.extract", lambda cfg, _: ExtractorNames(), domain_params("extract")),
    NamedKey("domains.NAME.gold", lambda cfg, _: VerifierNames(cfg.base_dir), domain_golds),
    NamedKey("eval.domains.NAME.type", lambda cfg, _: DOMAINS, eval_domain_types),
    NamedKey("domains.NAME.tools", lambda cfg, _: TOOLS, domain_tools),
    NamedKey("domains.NAME.tool_format", tool_format_settings, domain_tool_formats),
    NamedKey("monitor.NAME.action", lambda cfg, _: ALERT_ACTIONS, monitor_actions),
    NamedKey("monitor.sinks", lambda cfg, _: SINKS),
    NamedKey("monitor.proxy_gold.heldout_domains", lambda cfg, _: HeldoutGoldDomains(cfg), heldout_gold_domains),
    NamedKey("pipeline.source", lambda cfg, _: RolloutSources()),
]


def check_names(cfg: Config) -> None:
    """Raise ConfigError for the first value in `cfg` that names nothing registered."""
    for row in NAMED_KEYS:
        for key, value, name in (row.values or functools.partial(value_at, row.pattern))(cfg):
            row.registry(cfg, name).check(value, key)
    check_loss_weight(cfg)
    check_critic(cfg)


def check_critic(cfg: Config) -> None:
    """A value model and the estimator that reads it come together (`AdvantageFacts.needs_values`),
    with a loss that takes one advantage a token, in a run whose learner can carry a critic."""
    needs = ADVANTAGES.facts(cfg.rl.advantage).needs_values
    model = cfg.critic.model
    if needs and not model:
        raise ConfigError(f"config key 'rl.advantage' = {cfg.rl.advantage!r} reads a value model, which "
                          f"critic.model gives it; set critic.model=policy (a value head on a copy of the "
                          f"policy) or a model name")
    if model and not needs:
        raise ConfigError(f"config key 'critic.model' = {model!r}: a value model is read only by rl.advantage=gae; "
                          f"rl.advantage = {cfg.rl.advantage!r} would train it for nothing")
    if needs and not LOSSES.facts(cfg.rl.loss).token_advantage:
        raise ConfigError(f"config key 'rl.loss' = {cfg.rl.loss!r} takes one advantage a completion; "
                          f"rl.advantage = {cfg.rl.advantage!r} gives one a token")
    if model and cfg.train.learners > 1:
        raise ConfigError(f"config key 'critic.model' = {model!r}: the critic trains in the trainer process "
                          f"only, not on data-parallel ranks (train.learners = {cfg.train.learners}); "
                          f"set train.learners=1")


def check_loss_weight(cfg: Config) -> None:
    """A loss that takes no per-token importance weight (`LossFacts.token_weight`, e.g. gspo) with a
    setting that gives it one: a rollout correction, or stale rows under the trainer's proximal pass."""
    if LOSSES.facts(cfg.rl.loss).token_weight:
        return
    mode = cfg.rl.rollout_correction.mode
    if mode == "auto" and not SAMPLING_BACKENDS.facts(cfg.rollout.backend).learner_numerics:
        mode = f"auto (seq_mask for rollout.backend {cfg.rollout.backend})"
    if mode not in ("none", "auto"):
        raise ConfigError(f"config key 'rl.loss' = {cfg.rl.loss!r} takes no per-token importance weight, which "
                          f"rl.rollout_correction.mode = {mode!r} gives it; set rl.rollout_correction.mode=none")
    if cfg.pipeline.max_staleness > 0 and cfg.pipeline.proximal == "trainer":
        raise ConfigError(f"config key 'rl.loss' = {cfg.rl.loss!r} takes no per-token importance weight, which "
                          f"pipeline.max_staleness > 0 with pipeline.proximal = 'trainer' gives it; set "
                          f"pipeline.proximal=behaviour or pipeline.max_staleness=0")


def value_at(key: str, cfg: Config) -> list[tuple[str, str, str]]:
    """The value at dotted `key` as (key, value, ''); one per entry when it is a list."""
    value = functools.reduce(getattr, key.split("."), cfg)
    return [(key, v, "") for v in (value if isinstance(value, list) else [value])]
