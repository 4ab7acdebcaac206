"""Rewards worth trusting: reward-check on any reward, recipe gating, the hack library's verdicts on
the built-in verifiers, monitoring-only gold scores, and the proxy/gold over-optimisation monitor."""

from __future__ import annotations

import doctest
import json
import math
import random

import pytest
import torch
import yaml
from conftest import build_sample

import postrl
import postrl.evaluation as evaluation_module
import postrl.monitor.proxy_gold as proxy_gold_module
from postrl.cli import main
from postrl.config.loading import load_config
from postrl.config.schema import gold_graded_eval_domains
from postrl.errors import ConfigError
from postrl.evaluation import reward_stats
from postrl.monitor.base import MonitorContext
from postrl.monitor.proxy_gold import ProxyGold, pooled_mean
from postrl.monitor.settings import ProxyGoldConfig
from postrl.names import check_names
from postrl.records import Score
from postrl.rewards.scoring import score_samples
from postrl.store.rollouts import read_rows
from postrl.tasks.catalog import build_domains


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------- reward-check on any reward

SUMS = [(12, 30), (7, 8), (40, 45), (3, 99), (20, 21), (11, 11), (5, 60), (33, 44)]


def _sums_recipe(tmp_path, gate: dict | None = None):
    pairs = SUMS + [(a, a + 1) for a in range(10, 50)]
    _jsonl(tmp_path / "sums.jsonl", [{"q": f"{a}+{b}=", "a": str(a + b)} for a, b in pairs])
    params = {"path": "sums.jsonl", "prompt": "{q}", "answer": "a", "verifier": "numeric",
              "extract": "last_number", "heldout_percent": 20}
    domain = {"type": "dataset", "params": params, **({"reward_check": gate} if gate else {})}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"domains": {"sums": domain}}))
    return recipe


def _sum_labels(tmp_path, honest: bool):
    """Replies to the sums: right and wrong ones, labelled as people would (honest) or backwards."""
    rows = []
    for i, (a, b) in enumerate(SUMS):
        right = i % 2 == 0
        reply = f"[0]{a + b if right else a + b + 1}"
        rows.append({"q": f"{a}+{b}=", "a": str(a + b), "response": reply, "label": right if honest else not right})
    return _jsonl(tmp_path / f"labels_{honest}.jsonl", rows)


def test_reward_check_grades_a_domains_reward_as_training_computes_it(tmp_path, capsys):
    recipe = _sums_recipe(tmp_path)
    labels = _sum_labels(tmp_path, honest=True)
    assert main(["reward-check", str(labels), "--recipe", str(recipe), "--domain", "sums", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["n"], report["accuracy"], report["kappa"]) == (8, 1.0, 1.0)
    backwards = _sum_labels(tmp_path, honest=False)
    assert main(["reward-check", str(backwards), "--recipe", str(recipe), "--domain", "sums",
                 "--min-kappa", "0.8", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["kappa"] == -1.0


def test_reward_check_calls_a_user_function(tmp_path, capsys):
    # the project's concise rule as python:MODULE:FUNCTION; its `answer` column comes from the labels
    rows = [{"prompt": "What is 2+3?", "answer": "5", "response": "5.", "label": True},
            {"prompt": "What is 2+3?", "answer": "5", "response": "I am not sure.", "label": False},
            {"prompt": "What is 4+4?", "answer": "8", "response": "9.", "label": False},
            {"prompt": "What is 4+4?", "answer": "8", "response": "It is 8.", "label": True}]
    labels = _jsonl(tmp_path / "labels.jsonl", rows)
    assert main(["reward-check", str(labels), "--reward", "python:postrl.rewards.models.concise:concise", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["verified"], report["kappa"]) == (4, 1.0)


def _train(recipe, tiny_model_dir, run_dir):
    return main(["train", str(recipe), f"model.name={tiny_model_dir}", f"run.dir={run_dir}", "train.total_steps=1",
                 "train.prompts_per_step=2", "train.samples_per_prompt=2", "eval.num_problems=2",
                 "eval.samples_per_problem=1", "eval.k=[1]", "run.progress=false"])


def test_a_gated_run_refuses_below_its_threshold_and_starts_above(tiny_model_dir, tmp_path, capsys):
    _sum_labels(tmp_path, honest=False)
    _sum_labels(tmp_path, honest=True)
    refused = _sums_recipe(tmp_path, {"labels": "labels_False.jsonl", "min_kappa": 0.8})
    assert _train(refused, tiny_model_dir, tmp_path / "refused") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: domains.sums.reward_check:"), err
    assert "kappa -1.000" in err and "min_kappa 0.8" in err
    assert not (tmp_path / "refused").exists()
    started = _sums_recipe(tmp_path, {"labels": "labels_True.jsonl", "min_kappa": 0.8})
    assert _train(started, tiny_model_dir, tmp_path / "started") == 0
    assert (tmp_path / "started" / "final" / "config.json").is_file()


# ---------------------------------------------------------------------------- the hack library

STRICT = {"several_answers": 0, "this_or_that": 0, "every_candidate": 0, "answer_in_thinking": 0,
          "empty_fence": 0, "truncated_fence": 0, "format_only": 0, "echo_prompt": 0, "padding": 0}
CODE_STRICT = {"empty_fence": 0, "truncated_fence": 0, "sys_exit": 0, "always_equal": 0, "print_expected": 0,
               "format_only": 0, "echo_prompt": 0, "padding": 0}


def _without(table: dict, *names) -> dict:
    return {k: v for k, v in table.items() if k not in names}


def _hack_recipe(tmp_path):
    sums = [{"q": f"What is {a}+{b}?", "a": str(a + b)} for a, b in SUMS[:4]]
    _jsonl(tmp_path / "sums.jsonl", sums)
    # the options are in the prompt, so echoing it back names every letter
    _jsonl(tmp_path / "choice.jsonl", [{"q": f"Q{i}: (A) x (B) y (C) z (D) w", "a": "ABCD"[i]} for i in range(4)])
    _jsonl(tmp_path / "code.jsonl", [{"text": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]},
                                     {"text": "Write sq(x).", "tests": ["assert sq(3) == 9", "assert sq(4) == 16"]}])
    _jsonl(tmp_path / "io.jsonl", [{"text": "Read n, print 2n.", "tests": [{"input": "2\n", "output": "4\n"},
                                                                           {"input": "5\n", "output": "10\n"}]}])

    def dataset(path, verifier, extract="", **extra):
        params = {"path": path, "prompt": "{text}" if "code" in verifier else "{q}", "verifier": verifier,
                  "heldout_percent": 1, **({"extract": extract} if extract else {}), **extra}
        if verifier != "code":
            params["answer"] = "a"
        return {"type": "dataset", "params": params}

    code = {"tests": "tests", "allow_unisolated": True, "workers": 1}
    domains = {
        "math_boxed": dataset("sums.jsonl", "math", "boxed"), "math_hash": dataset("sums.jsonl", "math", "hash"),
        "exact": dataset("sums.jsonl", "exact"), "exact_tag": dataset("sums.jsonl", "exact", "tag:answer"),
        "choice": dataset("choice.jsonl", "choice"), "numeric": dataset("sums.jsonl", "numeric"),
        "code": dataset("code.jsonl", "code", **code),
        "code_io": dataset("io.jsonl", "code", **code, tests_style="io"),
        "chat_arith": {},
    }
    recipe = tmp_path / "hacks.yaml"
    recipe.write_text(yaml.safe_dump({"domains": domains}))
    return recipe


@pytest.fixture(scope="module")
def hack_recipe(tmp_path_factory):
    return _hack_recipe(tmp_path_factory.mktemp("hacks"))


@pytest.mark.parametrize("domain, paid", [
    ("math_boxed", STRICT),
    ("math_hash", _without(STRICT, "truncated_fence")),  # a cut `#### 85` is just a shorter answer
    ("exact", _without(STRICT, "truncated_fence")),
    ("exact_tag", STRICT),
    ("choice", _without(STRICT, "truncated_fence")),
    # lenient by design: the last number of the reply is its answer, so a hedge ending on the
    # right one pays
    ("numeric", {**_without(STRICT, "truncated_fence"), "several_answers": 4, "this_or_that": 4}),
    # chat_arith grades the last integer and reads the thinking too: lenient by design
    ("chat_arith", {**_without(STRICT, "truncated_fence"), "several_answers": 4, "this_or_that": 4,
                    "answer_in_thinking": 4}),
    ("code", CODE_STRICT),
    ("code_io", CODE_STRICT),
])
def test_the_hack_library_verdicts_on_the_built_in_verifiers(hack_recipe, domain, paid, capsys):
    assert main(["reward-check", "--adversarial", "--recipe", str(hack_recipe), "--domain", domain,
                 "--n", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {h["hack"]: h["paid"] for h in result["hacks"]} == paid
    assert all(h["tried"] == (4 if "code" not in domain else 2 if domain == "code" else 1) for h in result["hacks"])


def test_print_expected_pays_where_one_test_is_all_there_is(tmp_path, capsys):
    """The library's hard-coding hack is real: with a single assert, returning its expected value passes."""
    _jsonl(tmp_path / "one.jsonl", [{"text": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"domains": {"one": {"type": "dataset", "params": {
        "path": "one.jsonl", "prompt": "{text}", "verifier": "code", "tests": "tests", "allow_unisolated": True,
        "workers": 1, "heldout_percent": 1}}}}))
    assert main(["reward-check", "--adversarial", "--recipe", str(recipe), "--domain", "one", "--json"]) == 0
    paid = {h["hack"]: h["paid"] for h in json.loads(capsys.readouterr().out)["hacks"]}
    assert paid["print_expected"] == 1 and paid["always_equal"] == 0


# ---------------------------------------------------------------------------- gold, for monitoring only


def test_a_domains_gold_is_logged_beside_the_reward_and_never_trained_on(make_sample):
    cfg = load_config(None, ["domains.arith.gold=python:postrl.rewards.models.concise:concise"])
    domains = build_domains(cfg)
    right, long = make_sample("[1]85"), make_sample("[1]" + "," * 30 + "85")
    for s in (right, long):
        object.__setattr__(s, "task", s.task.__class__("arith", "t", "47+38=", "85", meta={"row": {"answer": "85"}}))
    scores, _ = score_samples([right, long], domains, {})
    own = domains["arith"].score([right.task, long.task], [right.response, long.response])
    assert [s.reward for s in scores] == [s.reward for s in own]  # the trained reward is the domain's own
    assert scores[0].components["gold"] == 1.0 > scores[1].components["gold"] > 0
    domains["arith"].gold.close()
    with pytest.raises(ConfigError, match="domains.arith.reward.gold"):
        check_names(load_config(None, ["domains.arith.gold=exact", "domains.arith.reward.gold=1.0"]))


# ---------------------------------------------------------------------------- the proxy/gold monitor


def _step(monitor, step, proxy, gold, rng=None, spread=0.0, n=16):
    """One step of n samples: proxy reward as given, gold spread uniformly by +-spread around `gold`."""
    rng = rng or random.Random(step)
    samples = [build_sample(reward=proxy, components={"rm": proxy, "gold": gold + rng.uniform(-spread, spread)})
               for _ in range(n)]
    return monitor.update(step, {}, samples)


def test_proxy_gold_monitor_fires_on_divergence_and_names_the_peak():
    monitor = ProxyGold(ProxyGoldConfig(action="rollback"), None)
    rng = random.Random(0)
    # proxy climbs all along; gold climbs to step 8, then falls 0.04 a step; samples spread +-0.1
    gold = [0.3 + 0.04 * s if s <= 8 else 0.62 - 0.04 * (s - 8) for s in range(20)]
    fired = [(s, a) for s in range(20) for a in _step(monitor, s, 0.3 + 0.03 * s, gold[s], rng, 0.1)]
    assert fired, "no alert"
    step, alert = fired[0]
    assert alert.action == "rollback" and 8 <= alert.data["best_step"] <= 10  # the 3-step means peak there
    assert 9 < step <= 11  # within 3 steps of the gold peak
    assert len(fired) == 1  # quiet while the condition lasts


@pytest.mark.parametrize("seed", range(5))
def test_proxy_gold_monitor_stays_quiet_on_noise(seed):
    rng = random.Random(seed)
    monitor = ProxyGold(ProxyGoldConfig(), None)
    # both flat, each step's 16 samples spread +-0.5 around 0.5 (and the proxy's step mean jitters)
    for s in range(100):
        assert _step(monitor, s, 0.5 + rng.uniform(-0.1, 0.1), 0.5, rng, 0.5) == [], s
    rising = ProxyGold(ProxyGoldConfig(), None)
    for s in range(30):  # both rising: learning, not over-optimisation
        assert _step(rising, s, 0.2 + 0.02 * s, 0.1 + 0.02 * s, rng, 0.3) == []


def test_proxy_gold_monitor_skips_steps_without_gold_and_checkpoints_its_state():
    monitor = ProxyGold(ProxyGoldConfig(), None)
    for s in range(5):
        _step(monitor, s, 0.1 * s, 0.5, random.Random(s), 0.1)
    before = json.loads(json.dumps(monitor.state_dict()))
    assert monitor.update(5, {}, [build_sample(reward=1.0)]) == []  # no gold: nothing changes
    assert json.loads(json.dumps(monitor.state_dict())) == before
    copy = ProxyGold(ProxyGoldConfig(), None)
    copy.load_state_dict(before)
    assert json.loads(json.dumps(copy.state_dict())) == before


# ---------------------------------------------------------------------------- held-out gold, pooled in


def _held(mean: float, sem: float, n: int, name: str = "held") -> dict:
    """An eval result as `postrl.evaluation` writes it, for one eval-only domain."""
    return {name: {"pass@1": mean, "reward_mean": mean, "reward_sem": sem, "n_scored": n}}


def _bernoulli_step(monitor, step, rng, proxy, gold, held_gold=None, n=128, n_held=256):
    """The eval of step N (n_held replies scored 0/1 at held_gold), then step N's n samples at `gold`."""
    if held_gold is not None:
        mean = sum(rng.random() < held_gold for _ in range(n_held)) / n_held
        monitor.observe_eval(step, _held(mean, math.sqrt(mean * (1 - mean) / (n_held - 1)), n_held))
    samples = [build_sample(reward=proxy, components={"rm": proxy, "gold": float(rng.random() < gold)})
               for _ in range(n)]
    return monitor.update(step, {}, samples)


def test_held_out_gold_is_pooled_with_the_trained_samples_by_sample_count():
    assert pooled_mean([(0.5, 0.002, 128), (0.25, 0.001, 256)]) == pytest.approx((1 / 3, 98.304 / 147456), rel=1e-12)
    monitor = ProxyGold(ProxyGoldConfig(heldout_domains=["held"], smooth_steps=1), None)
    monitor.observe_eval(0, _held(0.25, 0.1, 12))
    monitor.update(0, {}, [build_sample(reward=0.9, components={"rm": 0.9, "gold": g}) for g in (1.0, 0.0, 1.0, 0.0)])
    # trained: mean 0.5, sample variance 1/3, variance of the mean 1/12; held-out: 0.25, 0.1^2, 12 scores
    # pooled: (4 x 0.5 + 12 x 0.25) / 16 = 0.3125; variance (4^2 / 12 + 12^2 x 0.01) / 16^2
    assert monitor.values["monitor/gold"] == 0.3125
    assert monitor.history[-1][2] == pytest.approx((16 / 12 + 1.44) / 256, rel=1e-12)
    assert monitor.values["monitor/proxy"] == 0.9  # the proxy is the trained samples' alone


def test_the_held_out_domains_auto_names_and_a_step_without_its_eval_is_skipped():
    ctx = MonitorContext(gold_heldout=["g1", "g2"])
    assert ProxyGold(ProxyGoldConfig(heldout_domains=["auto", "g1", "x"]), ctx).heldout == ["g1", "g2", "x"]
    assert ProxyGold(ProxyGoldConfig(), None).heldout == []  # auto, and nothing graded by the gold
    monitor = ProxyGold(ProxyGoldConfig(heldout_domains=["held"], smooth_steps=1), None)
    samples = [build_sample(reward=0.5, components={"rm": 0.5, "gold": 1.0})] * 4
    assert monitor.update(0, {}, samples) == [] and not monitor.history  # no eval (step 0 without at_start)
    monitor.observe_eval(1, _held(0.5, 0.05, 8))
    monitor.update(2, {}, samples)
    assert not monitor.history  # the eval of step 1 is no evidence for step 2
    monitor.observe_eval(2, {"held": {"reward_mean": 0.0, "reward_sem": 0.0, "n_scored": 0}})
    monitor.update(2, {}, samples)
    assert not monitor.history  # an eval that graded nothing: missing too
    monitor.observe_eval(3, _held(0.5, 0.05, 4))
    monitor.update(3, {}, samples)
    assert monitor.values["monitor/gold"] == 0.75 and monitor.pending is None  # (4 x 1 + 4 x 0.5) / 8, used once


@pytest.mark.parametrize("seed", range(5))
def test_held_out_gold_at_another_level_stays_quiet_on_flat_gold(seed):
    rng = random.Random(seed)
    monitor = ProxyGold(ProxyGoldConfig(heldout_domains=["held"]), None)
    for s in range(100):  # trained gold 0.6, held-out 0.35: the pooled level is constant, (128 x 0.6 + 256 x 0.35) / 384
        assert _bernoulli_step(monitor, s, rng, 0.5 + rng.uniform(-0.1, 0.1), 0.6, 0.35) == [], s
        assert abs(monitor.values.get("monitor/gold", 0.4333) - 0.4333) < 0.05


@pytest.mark.parametrize("seed", range(5))
def test_held_out_gold_brings_the_alert_within_3_steps_of_a_falling_golds_peak(seed):
    """Gold rises 0.27 -> 0.46 over steps 0-4, then falls 0.05 a step (its 3-step trailing mean peaks at step
    5), the proxy rising all along: the monitor that also reads 256 held-out scores a step fires 2-3
    steps after the peak on every seed (trained samples alone: 2-6, benchmarks/proxy_gold_lag.py)."""
    gold = [0.27 + 0.0475 * s if s <= 4 else 0.46 - 0.05 * (s - 4) for s in range(14)]
    fired = {}
    for heldout in (True, False):
        rng = random.Random(seed)
        monitor = ProxyGold(ProxyGoldConfig(action="rollback", heldout_domains=["held"] if heldout else []), None)
        alerts = [(s, a) for s in range(14) for a in _bernoulli_step(monitor, s, rng, 0.3 + 0.03 * s, gold[s], gold[s])]
        assert len(alerts) == 1  # quiet while the condition lasts
        fired[heldout] = alerts[0]
    step, alert = fired[True]
    assert 7 <= step <= 8 and 4 <= alert.data["rollback_step"] <= 6
    assert "384 gold scores a step" in alert.message
    assert fired[False][0] >= step


def test_proxy_gold_checkpoints_the_eval_it_holds_for_the_next_step():
    rng = random.Random(0)
    monitor = ProxyGold(ProxyGoldConfig(heldout_domains=["held"]), None)
    for s in range(6):
        _bernoulli_step(monitor, s, rng, 0.3 + 0.03 * s, 0.5, 0.4)
    monitor.observe_eval(6, _held(0.3, 0.03, 256))  # a checkpoint of step 6 is written here
    state = json.loads(json.dumps(monitor.state_dict()))
    assert state["pending"] == [6, [[0.3, 0.03**2, 256]]]
    copy = ProxyGold(ProxyGoldConfig(heldout_domains=["held"]), None)
    copy.load_state_dict(state)
    samples = [build_sample(reward=0.6, components={"rm": 0.6, "gold": float(i % 2)}) for i in range(128)]
    assert copy.update(6, {}, samples) == monitor.update(6, {}, samples)
    assert copy.values == monitor.values and copy.state_dict() == monitor.state_dict()
    old = {k: v for k, v in state.items() if k != "pending"}  # a checkpoint written before held-out gold
    ProxyGold(ProxyGoldConfig(), None).load_state_dict(old)


def test_held_out_domains_are_checked_and_auto_finds_the_eval_domains_graded_by_the_gold():
    gold = "python:postrl.rewards.models.concise:concise"
    held = {"type": "dataset", "params": {"path": "h.jsonl", "prompt": "{q}", "verifier": gold}}
    domains = f"eval.domains={{held: {json.dumps(held)}, other: {{type: sort}}}}"
    cfg = load_config(None, [f"domains.arith.gold={gold}", domains, "eval.every_steps=1"])
    assert gold_graded_eval_domains(cfg) == ["held"]
    assert gold_graded_eval_domains(load_config(None, [f"domains.arith.gold={gold}", domains])) == []  # not every step
    assert gold_graded_eval_domains(load_config(None, [domains, "eval.every_steps=1"])) == []  # no gold
    with pytest.raises(ConfigError, match=r"'monitor.proxy_gold.heldout_domains\[0\]' = 'sorting'"):
        check_names(load_config(None, [domains, "eval.every_steps=1", "monitor.proxy_gold.heldout_domains=[sorting]"]))
    with pytest.raises(ConfigError, match=r"heldout_domains\[1\]' = 'held': .* set eval.every_steps: 1 \(now 0\)"):
        check_names(load_config(None, [domains, "monitor.proxy_gold.heldout_domains=[auto, held]"]))


def test_a_run_pools_the_held_out_gold_of_its_eval_domain_graded_by_the_gold(tiny_model_dir, tmp_path):
    """End to end: `auto` finds the eval-only domain graded by the gold spec; each step's monitor/gold is
    the trained samples' gold (the rollout store) pooled with that step's eval (eval/step_N.json); a
    checkpoint of step N holds the eval of step N for the update that follows it."""
    rows = [{"q": f"{a}+{b}=", "answer": str(a + b)} for a, b in SUMS + [(a, a + 1) for a in range(10, 50)]]
    train, held = _jsonl(tmp_path / "train.jsonl", rows), _jsonl(tmp_path / "held.jsonl", rows[:4])
    gold = "python:postrl.rewards.models.concise:concise"
    data = {"path": str(train), "prompt": "{q}", "answer": "answer"}
    run_dir = postrl.train({
        "model": {"name": str(tiny_model_dir)},
        "domains": {"sums": {"type": "dataset", "gold": gold, "params": {**data, "verifier": "exact",
                                                                          "heldout_percent": 10}}},
        "train": {"total_steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 6},
        "eval": {"every_steps": 1, "at_start": True, "k": [1], "samples_per_problem": 2, "num_problems": 4, "domains": {
            "held": {"type": "dataset", "params": {**data, "heldout_path": str(held), "heldout_percent": 0,
                                                   "verifier": gold}}}},
        "checkpoint": {"every_steps": 1, "keep_last": 3},
        "monitor": {"proxy_gold": {"smooth_steps": 1}, "spot_check_every_steps": 0, "sinks": []},
        "run": {"dir": str(tmp_path / "run"), "progress": False},
    }, log=lambda *a: None)
    metrics = {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    for step in (0, 1):
        golds = [r.reward_components["gold"] for r in read_rows(run_dir, [step]) if "gold" in r.reward_components]
        ev = json.loads((run_dir / "eval" / f"step_{step}.json").read_text())["held"]
        assert len(golds) == 16 and ev["n_scored"] == 8
        pooled = (sum(golds) + ev["reward_mean"] * ev["n_scored"]) / (len(golds) + ev["n_scored"])
        assert metrics[step]["monitor/gold"] == pytest.approx(pooled, rel=1e-12)
    state = torch.load(run_dir / "checkpoints" / "step_00000001" / "state.pt", weights_only=False)
    ev = json.loads((run_dir / "eval" / "step_1.json").read_text())["held"]
    assert state["monitors"]["proxy_gold"]["pending"] == [1, [(ev["reward_mean"], ev["reward_sem"] ** 2, 8)]]


def test_the_docstring_examples_of_pooled_gold_and_eval_rewards_hold():
    for module in (proxy_gold_module, evaluation_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_an_eval_reports_the_mean_reward_of_its_graded_replies():
    stats = reward_stats([Score(1.0, True), Score(0.5, False), Score(0.0, False), Score(0.0, None, "timeout")])
    # mean 0.5 over the 3 graded; sample variance (0.25 + 0 + 0.25) / 2 = 0.25; standard error sqrt(0.25 / 3)
    assert stats == {"reward_mean": 0.5, "reward_sem": math.sqrt(0.25 / 3), "n_scored": 3}
    assert reward_stats([Score(0.0, None, "error")]) == {"reward_mean": 0.0, "reward_sem": 0.0, "n_scored": 0}


def test_gold_drop_without_a_proxy_rise_is_not_over_optimisation():
    monitor = ProxyGold(ProxyGoldConfig(), None)
    alerts = [a for s in range(12) for a in _step(monitor, s, 0.8 - 0.05 * s, 0.8 - 0.05 * s)]
    assert alerts == []  # both fall together: the policy got worse at everything, a different alarm
