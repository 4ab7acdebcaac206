"""Config loading: recipes, dotted overrides, and one-line errors for every kind of bad input."""

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Literal

import pytest

from postrl.cli import main
from postrl.config.fields import Choice, Range, allowed_of, ranged
from postrl.config.loading import from_dict, load_config
from postrl.config.schema import Config
from postrl.errors import ConfigError

RECIPE = "recipes/default.yaml"


def test_default_recipe_loads_and_overrides_apply():
    cfg = load_config(RECIPE, ["rl.kl_coef=0.02", "train.total_steps=5", "eval.k=[1,4]", "domains.arith.weight=2"])
    assert isinstance(cfg, Config)
    assert cfg.rl.kl_coef == 0.02 and cfg.train.total_steps == 5 and cfg.eval.k == [1, 4]
    assert cfg.domains["arith"].weight == 2.0 and cfg.domains["arith"].params == {"levels": [2], "require_carry": True}


def test_int_and_exponent_strings_are_accepted_for_float():
    assert load_config(None, ["rl.kl_coef=0"]).rl.kl_coef == 0.0
    assert load_config(None, ["train.lr=5e-5"]).train.lr == 5e-5  # YAML 1.1 reads this as a string
    with pytest.raises(ConfigError, match="config key 'train.lr' = 'fast': expected float, got str"):
        load_config(None, ["train.lr=fast"])


@pytest.mark.parametrize(
    "override,message",
    [
        ("rl.kl_cof=0.1", "unknown config key 'rl.kl_cof'; did you mean 'rl.kl_coef'?"),
        ("trian.total_steps=3", "unknown config key 'trian'; did you mean 'train'?"),
        ("train.total_steps=abc", "config key 'train.total_steps' = 'abc': expected int, got str"),
        ("rl.scale_by_std=3", "config key 'rl.scale_by_std' = 3: expected bool, got int"),
        ("eval.k=[1,x]", "config key 'eval.k[1]' = 'x': expected int, got str"),
        ("train.minibatches=3", "config key 'train.minibatches' = 3: must divide the 256 completions per step"),
        ("rl.kl_in=both", "config key 'rl.kl_in' = 'both': expected loss or reward"),
        ("nokey", "override 'nokey' is not of the form key=value"),
    ],
)
def test_bad_values_raise_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, [override])
    assert str(err.value) == message


# one case per kind of declared check: each fails if its declaration is removed from the field
@pytest.mark.parametrize(
    "override,message",
    [
        ("train.total_steps=0", "config key 'train.total_steps' = 0: must be >= 1"),  # a range
        ("train.epochs=-1", "config key 'train.epochs' = -1.0: must be >= 0"),
        ("train.epochs=.nan", "config key 'train.epochs' = nan: must be >= 0"),  # NaN is in no range
        ("train.top_p=0", "config key 'train.top_p' = 0.0: must be in (0, 1]"),  # both ends
        ("train.top_p=1.5", "config key 'train.top_p' = 1.5: must be in (0, 1]"),
        ("train.temperature=0", "config key 'train.temperature' = 0.0: must be > 0"),
        ("eval.samples_per_problem=0", "config key 'eval.samples_per_problem' = 0: must be >= 1"),
        ("curriculum.mastery_pass_rate=0", "config key 'curriculum.mastery_pass_rate' = 0.0: must be in (0, 1]"),
        ("pipeline.is_cap=0.5", "config key 'pipeline.is_cap' = 0.5: must be >= 1"),
        ("pipeline.proximal=stale", "config key 'pipeline.proximal' = 'stale': expected trainer or behaviour"),
        ("pipeline.reference=gpu", "config key 'pipeline.reference' = 'gpu': expected sampler or learner"),
        ("rl.kl_in=3", "config key 'rl.kl_in' = 3: expected loss or reward"),  # a Literal of str takes no int
        ("run.device=tpu", "config key 'run.device' = 'tpu': expected auto, cpu or cuda"),
        ("run.device=gpu:0", "config key 'run.device' = 'gpu:0': expected auto, cpu or cuda"),
        # nested: a section of a section, and the sections of a mapping (trained and eval-only domains)
        ("monitor.wandb.mode=live",
         "config key 'monitor.wandb.mode' = 'live': expected online, offline or disabled (or empty)"),
        ("domains.arith.max_turns=-1", "config key 'domains.arith.max_turns' = -1: must be >= 0"),
        ("domains.arith.tool_timeout_s=0", "config key 'domains.arith.tool_timeout_s' = 0.0: must be > 0"),
        ("eval.domains.extra.tool_output_chars=0", "config key 'eval.domains.extra.tool_output_chars' = 0: must be >= 1"),
        ("domains.arith.stop=['x','']", "config key 'domains.arith.stop[1]' = '': must not be empty"),  # each item
    ],
)
def test_declared_choices_and_ranges_raise_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, [override])
    assert str(err.value) == message


def test_values_inside_the_declared_choices_and_ranges_load():
    cfg = load_config(RECIPE, ["run.device=cuda:1", "rl.kl_in=reward", "monitor.wandb.mode=offline", "train.top_p=1",
                               "pipeline.proximal=behaviour", "domains.arith.max_turns=0", "train.epochs=0"])
    assert (cfg.run.device, cfg.rl.kl_in, cfg.monitor.wandb.mode) == ("cuda:1", "reward", "offline")
    assert cfg.train.top_p == 1.0 and cfg.pipeline.proximal == "behaviour"


@dataclass
class _Inner:
    mode: Literal["fast", "slow"] = "fast"
    """A choice."""
    count: int = ranged(1, ge=1)
    """A range."""


@dataclass
class _Outer:
    share: float = ranged(0.5, gt=0, le=1)
    """A range open at one end."""
    inner: _Inner = field(default_factory=_Inner)
    """A nested section."""
    by_name: dict[str, _Inner] = field(default_factory=dict)
    """Sections by name."""


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"share": 0}, "config key 'x.share' = 0.0: must be in (0, 1]"),
        ({"inner": {"mode": "medium"}}, "config key 'x.inner.mode' = 'medium': expected fast or slow"),
        ({"by_name": {"a": {"count": 0}}}, "config key 'x.by_name.a.count' = 0: must be >= 1"),
    ],
)
def test_from_dict_checks_any_dataclass_s_declared_choices_and_ranges(raw, message):
    """The checks belong to `from_dict`, not to `Config`: a domain's params dataclass gets them too."""
    with pytest.raises(ConfigError) as err:
        from_dict(_Outer, raw, "x.")
    assert str(err.value) == message
    ok = from_dict(_Outer, {"share": 1, "inner": {"mode": "slow", "count": 3}, "by_name": {"a": {}}}, "x.")
    assert ok == _Outer(1.0, _Inner("slow", 3), {"a": _Inner()})


def test_range_and_choice_say_what_they_allow():
    assert (str(Range(ge=1)), str(Range(gt=0)), str(Range(gt=0, le=1)), str(Range(ge=0, le=1))) == (
        ">= 1", "> 0", "in (0, 1]", "in [0, 1]")
    assert 0 not in Range(gt=0) and 1 in Range(gt=0, le=1) and 1.01 not in Range(gt=0, le=1)
    assert math.nan not in Range(ge=0)
    assert str(Choice(("", "on", "off"))) == "on or off (or empty)" and str(Choice(("only",))) == "only"
    assert "cuda:3" in Choice(("cpu", "cuda"), sep=":") and "cuda:3" not in Choice(("cpu", "cuda"))


def _declared(cls: type, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, allowed, default) of every field of the tree that declares what it allows."""
    hints, out = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        tp, allowed = hints[f.name], allowed_of(hints[f.name], f)
        if dataclasses.is_dataclass(tp):
            out += _declared(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            out += _declared(typing.get_args(tp)[1], f"{prefix}{f.name}.NAME.")
        elif allowed is not None:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((prefix + f.name, allowed, default))
    return out


def test_every_default_is_inside_what_its_field_allows():
    declared = _declared(Config)
    assert len(declared) >= 40 and {"train.top_p", "rl.kl_in", "monitor.wandb.mode", "domains.NAME.stop"} <= {
        k for k, _, _ in declared}
    for key, allowed, default in declared:
        assert all(v in allowed for v in default) if isinstance(default, list) else default in allowed, key


def test_domain_params_are_validated_by_the_domain(tmp_path):
    from postrl.errors import UserError
    from postrl.tasks.catalog import make_domain

    with pytest.raises(UserError, match="unknown config key 'domains.arith.params.levls'; did you mean"):
        make_domain("arith", {"levls": [1]})
    with pytest.raises(UserError, match="levels are"):
        make_domain("arith", {"levels": [9]})


def run_cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err.strip()
    return code, err


def test_cli_unknown_key_exits_2_with_one_line(capsys):
    code, err = run_cli(["plan", RECIPE, "rl.kl_cof=0.1"], capsys)
    assert code == 2
    assert err == "error: unknown config key 'rl.kl_cof'; did you mean 'rl.kl_coef'?"


def test_cli_missing_recipe_exits_2(capsys):
    code, err = run_cli(["train", "recipes/nope.yaml"], capsys)
    assert code == 2 and err == "error: recipe not found: recipes/nope.yaml"


def test_cli_invalid_yaml_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  total_steps: [1,\n")
    code, err = run_cli(["plan", str(bad)], capsys)
    assert code == 2 and err.startswith(f"error: {bad}: line ") and "invalid YAML" in err
    assert len(err.splitlines()) == 1


def test_cli_unknown_domain_exits_2(capsys, tmp_path):
    code, err = run_cli(["train", RECIPE, "domains={nosuch: {}}", f"run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and err.startswith("error: config key 'domains.nosuch': unknown domain (expected one of: arith")
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()


def test_cli_missing_model_exits_2(capsys, tmp_path):
    code, err = run_cli(["train", RECIPE, f"model.name={tmp_path / 'none'}", f"run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and err.startswith(f"error: model not found: {tmp_path / 'none'} (not a directory")
    assert "'tiny-arith'" in err and len(err.splitlines()) == 1


def test_cli_corrupt_model_exits_2(capsys, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    code, err = run_cli(["eval", str(broken)], capsys)
    assert code == 2 and err.startswith(f"error: cannot load model from {broken}:")


def test_plan_prints_batch_arithmetic(capsys):
    assert main(["plan", RECIPE]) == 0
    out = capsys.readouterr().out
    assert "completions per step   32 x 8 = 256" in out
    assert "optimiser steps/batch  1 epochs x 2 minibatches = 2" in out
