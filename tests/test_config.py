"""Config loading: recipes, dotted overrides, and one-line errors for every kind of bad input."""

import pytest

from postrl.cli import main
from postrl.config import Config, ConfigError, load_config

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
