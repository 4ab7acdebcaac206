"""Every config key that names a registered thing is checked before anything is built, and the
registry type that all of them use."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass

import pytest

from postrl import names
from postrl.cli import main
from postrl.errors import ConfigError
from postrl.registry import Registry
from postrl.tasks.catalog import make_domain

RECIPE = "recipes/default.yaml"

# key pattern -> (an override that names nothing registered, the key the error must name)
BAD_NAMES = {
    "engine": ("engine=bogus_name", "engine"),
    "rollout.backend": ("rollout.backend=bogus_name", "rollout.backend"),
    "rl.advantage": ("rl.advantage=bogus_name", "rl.advantage"),
    "rl.loss": ("rl.loss=bogus_name", "rl.loss"),
    "rl.kl_estimator": ("rl.kl_estimator=bogus_name", "rl.kl_estimator"),
    "rl.loss_agg": ("rl.loss_agg=bogus_name", "rl.loss_agg"),
    "curriculum.schedule": ("curriculum.schedule=bogus_name", "curriculum.schedule"),
    "eval.seesaw_action": ("eval.seesaw_action=bogus_name", "eval.seesaw_action"),
    "eval.best_aggregate": ("eval.best_aggregate=bogus_name", "eval.best_aggregate"),
    "domains.NAME.type": ("domains.arith.type=bogus_name", "domains.arith.type"),
    "domains.NAME.reward.TERM": ("domains.arith.reward.bogus_name=1.0", "domains.arith.reward.bogus_name"),
    "domains.NAME.params.verifier": ("domains.gsm={type: dataset, params: {path: x.jsonl, verifier: bogus_name}}",
                                     "domains.gsm.params.verifier"),
    "domains.NAME.params.extract": ("domains.gsm={type: dataset, params: {path: x.jsonl, extract: bogus_name}}",
                                    "domains.gsm.params.extract"),
    "domains.NAME.gold": ("domains.arith.gold=bogus_name", "domains.arith.gold"),
    "eval.domains.NAME.type": ("eval.domains.extra.type=bogus_name", "eval.domains.extra.type"),
    "domains.NAME.tools": ("domains.arith.tools=[bogus_name]", "domains.arith.tools"),
    "domains.NAME.tool_format": ("domains.arith.tool_format=bogus_name", "domains.arith.tool_format"),
    "monitor.NAME.action": ("monitor.kl_spike.action=bogus_name", "monitor.kl_spike.action"),
    "monitor.sinks": ("monitor.sinks=[bogus_name]", "monitor.sinks"),
    "monitor.proxy_gold.heldout_domains": ("monitor.proxy_gold.heldout_domains=[bogus_name]",
                                           "monitor.proxy_gold.heldout_domains[0]"),
    "pipeline.source": ("pipeline.source=replay:/nonexistent", "pipeline.source"),
}


def test_every_named_key_is_tested():
    """A registry key added to NAMED_KEYS without a case here fails this test."""
    assert {row.pattern for row in names.NAMED_KEYS} == set(BAD_NAMES)


def _run_cli(command: str, override: str, tmp_path, monkeypatch, capsys) -> tuple[int, str]:
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("POSTRL_CACHE", str(cache))  # a model loaded (or pretrained) would land here
    code = main([command, RECIPE, override, f"run.dir={tmp_path / 'run'}"])
    assert list(cache.iterdir()) == []
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "plan"])
@pytest.mark.parametrize("pattern", sorted(BAD_NAMES))
def test_a_bad_name_stops_the_command_before_anything_is_built(pattern, command, tmp_path, monkeypatch, capsys):
    override, key = BAD_NAMES[pattern]
    code, err = _run_cli(command, override, tmp_path, monkeypatch, capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"error: config key '{key}'"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_verifier_named_per_value_of_a_split_file_is_checked_under_its_own_key(command, tmp_path, monkeypatch,
                                                                                  capsys):
    override = ("domains={mix: {type: dataset, params: {path: x.parquet, prompt: '{q}', answer: a, "
                "split_by: data_source, verifiers: {openai/gsm8k: math, other: bogus_name}}}}")
    code, err = _run_cli(command, override, tmp_path, monkeypatch, capsys)
    assert code == 2 and not (tmp_path / "run").exists()
    assert len(err.splitlines()) == 1
    assert err.startswith("error: config key 'domains.mix.params.verifiers.other' = 'bogus_name': unknown verifier")


def test_the_train_command_exits_2_in_a_fresh_process(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "postrl", "train", RECIPE, "rl.loss=bogus_name", f"run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, env={**os.environ, "POSTRL_CACHE": str(cache)}, timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: config key 'rl.loss' = 'bogus_name': unknown policy loss (expected one of: cispo, gspo, ppo_clip)"
    ]
    assert not (tmp_path / "run").exists() and list(cache.iterdir()) == []  # no model loaded or pretrained


def test_the_default_recipes_name_only_registered_things():
    from postrl.config.loading import load_config

    for recipe in ("default", "multidomain", "hacking", "smollm2-arith", "smollm2-joint"):
        names.check_names(load_config(f"recipes/{recipe}.yaml"))


def test_an_empty_domain_type_is_the_domains_key():
    from postrl.config.loading import load_config

    with pytest.raises(ConfigError) as e:
        names.check_names(load_config(RECIPE, ["domains.arith.weight=0.5", "domains.arth.weight=0.5"]))
    assert str(e.value).startswith("config key 'domains.arth': unknown domain; did you mean 'arith'?")


def test_reward_models_and_the_domains_components_are_reward_terms():
    from postrl.config.loading import load_config

    overrides = ["domains={code: {reward: {compiles: 0.2, tests: 0.8, my_rm: 0.1, reward: 1.0}}}", "reward_models={my_rm: x}"]
    names.check_names(load_config(RECIPE, overrides))
    with pytest.raises(ConfigError, match="config key 'domains.code.reward.my_rm': unknown reward term"):
        names.check_names(load_config(RECIPE, overrides[:1]))


def test_a_domain_type_builds_under_the_recipe_key():
    """`domains: {easy: {type: arith}}`: an arith domain whose tasks are labelled `easy`."""
    easy = make_domain("arith", {"levels": [1]}, seed=0, name="easy")
    assert easy.name == "easy" and easy.sample(random.Random(0)).domain == "easy"
    assert {t.domain for t in easy.heldout(5)} == {"easy"}
    assert make_domain("arith", {"levels": [1]}).sample(random.Random(0)).domain == "arith"
    with pytest.raises(ConfigError, match="config key 'domains.easy.type' = 'arth': unknown domain"):
        make_domain("arth", {}, name="easy")


# ---- the registry type ---------------------------------------------------------------------------


def test_registry_gets_what_was_registered():
    reg = Registry("policy loss", key="rl.loss")

    @reg.register("ppo_clip")
    def ppo_clip():
        pass

    assert reg.get("ppo_clip") is ppo_clip and "ppo_clip" in reg and reg.names() == ["ppo_clip"]
    reg.check("ppo_clip")


def test_registry_refuses_a_name_twice():
    reg = Registry("domain")
    reg.add("arith", 1)
    with pytest.raises(ValueError, match="domain 'arith' registered twice"):
        reg.add("arith", 2)
    assert reg.get("arith") == 1


def test_registry_unknown_name_says_the_key_the_closest_name_and_all_names():
    reg = Registry("policy loss", key="rl.loss")
    reg.add("ppo_clip", None)
    reg.add("cispo", None)
    with pytest.raises(ConfigError) as e:
        reg.get("ppo_clp")
    assert str(e.value) == ("config key 'rl.loss' = 'ppo_clp': unknown policy loss; did you mean 'ppo_clip'? "
                            "(expected one of: cispo, ppo_clip)")
    with pytest.raises(ConfigError) as e:
        reg.check("zzz", key="other.key")
    assert str(e.value) == "config key 'other.key' = 'zzz': unknown policy loss (expected one of: cispo, ppo_clip)"
    with pytest.raises(ConfigError) as e:  # the name is the key's last part: said once
        reg.check("zzz", key="domains.NAME.reward.zzz")
    assert str(e.value).startswith("config key 'domains.NAME.reward.zzz': unknown policy loss (")
    with pytest.raises(ConfigError) as e:  # no key: not a recipe's name
        Registry("domain").check("zzz")
    assert str(e.value) == "'zzz': unknown domain (expected one of: none registered)"


def test_registry_remove_forgets_a_name():
    reg = Registry("reward term")
    reg.add("rm", 1)
    reg.remove("rm")
    assert "rm" not in reg and len(reg) == 0
    reg.add("rm", 2)  # registered again, for the next run
    assert reg.get("rm") == 2
    reg.remove("never_registered")  # nothing to forget: no error


def test_registry_lists_a_large_family_once():
    reg = Registry("domain")
    for name in ["arith", "rg:a", "rg:b", "rg:c", "rg:d", "x:y"]:
        reg.add(name, None)
    with pytest.raises(ConfigError, match=r"\(expected one of: arith, rg:<name> \(4 of them\), x:y\)"):
        reg.check("nope")


def test_registry_entries_carry_their_facts():
    @dataclass(frozen=True)
    class Facts:
        components: tuple[str, ...] = ()
        needs_answer: bool = True

    reg = Registry("verifier", key="domains.NAME.params.verifier", facts=Facts)
    reg.add("code", "make_code", components=("tests",), needs_answer=False)

    @reg.register("exact")
    def exact():
        pass

    assert reg.facts("code") == Facts(("tests",), False) and reg.get("code") == "make_code"
    assert reg.facts("exact") == Facts() and reg.get("exact") is exact  # registered without facts: the defaults
    with pytest.raises(TypeError):
        reg.add("regex", "make_regex", need_answer=False)  # a fact the type does not declare
    assert "regex" not in reg
    with pytest.raises(ConfigError, match=r"^config key 'domains.NAME.params.verifier' = 'zzz': unknown verifier"):
        reg.facts("zzz")
    reg.remove("code")
    assert [name for name, _ in reg.all_facts()] == ["exact"]
    reg.add("code", "again")  # registered again: its facts are the new registration's
    assert reg.facts("code") == Facts()
