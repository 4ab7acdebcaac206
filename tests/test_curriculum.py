"""Curriculum: learnability weights worked out by hand, parking and re-probing, domain floors,
level progression, dynamic sampling, state round-trips, seesaw alerts."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch

from postrl.checkpoint import CheckpointManager
from postrl.config.loading import load_config
from postrl.config.schema import CurriculumConfig
from postrl.curriculum.dynamic import fill_batch, has_signal
from postrl.curriculum.sampler import TaskSampler
from postrl.curriculum.schedule import (
    LearnabilitySchedule,
    domain_shares,
    expected_learnability,
    make_schedule,
)
from postrl.errors import ConfigError
from postrl.monitor.seesaw import seesaw_alerts
from postrl.names import check_names
from postrl.records import Sample, Score, Task

DOMAINS = {"arith": [1, 2, 3], "code": [1, 2], "sort": [1]}


def group(task_id: str, wins: int, n: int = 8, domain: str = "arith", level: int = 1, g: int = 0) -> list[Sample]:
    """One group of n samples of one problem, `wins` of them correct (reward 1)."""
    task = Task(domain, task_id, task_id, "0", level)
    return [
        Sample(task, g, [1], [2], [-1.0], "x", "stop", 1.0, 0, Score(float(i < wins), correct=i < wins))
        for i in range(n)
    ]


def schedule(**overrides) -> LearnabilitySchedule:
    settings = CurriculumConfig(schedule="learnability", **overrides)
    return make_schedule(settings, {d: 1.0 for d in DOMAINS}, DOMAINS)


# ---------------------------------------------------------------------------- problem weights


def test_expected_learnability_by_hand():
    # Beta(a, b) posterior: E[p(1-p)] = ab / ((a+b)(a+b+1))
    assert expected_learnability(0, 0) == pytest.approx(1 / 6)  # a=b=1: 1/(2*3)
    assert expected_learnability(8, 8) == pytest.approx(9 / 110)  # a=9, b=1: 9/(10*11)
    assert expected_learnability(8, 0) == pytest.approx(9 / 110)
    assert expected_learnability(8, 4) == pytest.approx(25 / 110)  # a=b=5: 25/(10*11)
    assert expected_learnability(16, 16) == pytest.approx(17 / 342)  # a=17, b=1: 17/(18*19)


def test_task_weights_on_hand_made_histories():
    s = schedule(min_problem_weight=0.1, park_after_attempts=100)  # sort: one level, no level factor
    history = [group(t, w, g=g, domain="sort") for g, (t, w) in enumerate(
        [("solved", 8), ("half", 4), ("twice", 8), ("floor", 8)])]
    s.update(0, [x for grp in history for x in grp])
    s.update(1, [x for k, t in enumerate(["twice"] + ["floor"] * 7) for x in group(t, 8, g=k, domain="sort")])
    w = {tid: s.task_weight(Task("sort", tid, tid, "0", 1)) for tid in ("solved", "half", "twice", "floor", "new")}
    assert w["new"] == 1.0  # unseen: always kept
    assert w["half"] == 1.0  # 25/110 over 1/6 = 150/110, capped at 1
    assert w["solved"] == pytest.approx(float(Fraction(9, 110) / Fraction(1, 6)))  # 54/110 = 0.4909
    assert w["twice"] == pytest.approx(float(Fraction(17, 342) / Fraction(1, 6)))  # 16/16: 0.2982
    # floor: 64/64 in the 8-group window, 6*65/(66*67) = 0.088 < 0.1
    assert w["floor"] == 0.1


def test_problem_window_forgets_old_groups():
    s = schedule(problem_window_groups=2, park_after_attempts=100)
    for step in range(3):
        s.update(step, group("p", 8 if step == 0 else 4))
    assert s.rates.problem("p") == (16, 8)  # the 8/8 group fell out of the window


# ---------------------------------------------------------------------------- parking


def test_never_solved_problem_is_parked_and_reprobed():
    s = schedule(park_after_attempts=16, reprobe_every_steps=5)
    hard = Task("arith", "hard", "hard", "0", 1)
    s.update(0, group("hard", 0))
    assert s.task_weight(hard) > 0  # 8 attempts: not yet
    s.update(1, group("hard", 0))
    assert s.parked == {"hard": 1}
    for step in range(2, 6):  # steps 2..5 draw nothing of it
        assert s.task_weight(hard) == 0.0
        s.update(step, group("other", 4))
    assert s.step == 6 and s.task_weight(hard) == 1.0  # 5 steps after parking: re-probe
    s.update(6, group("hard", 0))  # the probe fails: parked again, from step 6
    assert s.parked == {"hard": 6} and s.task_weight(hard) == 0.0
    for step in range(7, 11):
        s.update(step, [])
    assert s.task_weight(hard) == 1.0
    s.update(11, group("hard", 1))  # a success releases it
    assert "hard" not in s.parked and s.task_weight(hard) > 0


class Pool:
    """A finite domain: problems p0..p3, level 1."""

    name, levels = "sort", [1]

    def sample(self, rng, level=None):
        i = rng.randrange(4)
        return Task("sort", f"p{i}", f"p{i}", "0", 1)


def test_sampler_skips_parked_problem_until_its_reprobe():
    s = schedule(park_after_attempts=8, reprobe_every_steps=3)
    s.update(0, group("p0", 0, domain="sort"))  # parked at step 0
    sampler = TaskSampler({"sort": Pool()}, seed=0)
    drawn = {}
    for step in range(1, 5):
        drawn[step] = {t.task_id for t in sampler.next_batch(64, {"sort": 1.0}, s.task_weight)}
        s.update(step, [])
    assert "p0" not in drawn[1] | drawn[2]
    assert "p0" in drawn[3] and {"p1", "p2", "p3"} <= drawn[3]


def test_sampler_rejects_in_proportion_to_weight():
    sampler = TaskSampler({"sort": Pool()}, seed=1)
    tasks = sampler.next_batch(4000, {"sort": 1.0}, task_weight=lambda t: 0.25 if t.task_id == "p0" else 1.0)
    share = sum(t.task_id == "p0" for t in tasks) / len(tasks)
    assert share == pytest.approx(0.25 / 3.25, abs=0.02)  # kept mass 0.25 against 1+1+1


class Named:
    """A domain of one problem, named after it."""

    levels = [1]

    def __init__(self, name: str):
        self.name = name

    def sample(self, rng, level=None):
        return Task(self.name, self.name, self.name, "0", 1)


def test_stratified_draws_give_each_domain_its_share_rounded_and_independent_ones_do_not():
    weights = {"wp": 0.2, "lc": 0.4, "code": 0.4}  # the joint benchmark's floor: 1.6 of 8 prompts
    counts = {}
    for draw in ("stratified", "independent"):
        sampler = TaskSampler({name: Named(name) for name in weights}, seed=3, domain_draw=draw)
        steps = [[t.domain for t in sampler.next_batch(8, weights)] for _ in range(400)]
        counts[draw] = [{d: batch.count(d) for d in weights} for batch in steps]
    strat, indep = counts["stratified"], counts["independent"]
    assert all(c["wp"] in (1, 2) and c["lc"] in (3, 4) and c["code"] in (3, 4) and sum(c.values()) == 8
               for c in strat)  # floor or ceil of 8 x weight, every step
    assert sum(c["wp"] for c in strat) / 400 == pytest.approx(1.6, abs=0.05)  # and 8 x weight on average
    assert sum(c["wp"] == 0 for c in indep) / 400 == pytest.approx(0.8**8, abs=0.05)  # left out ~17% of steps
    orders = {tuple(t.domain for t in TaskSampler({n: Named(n) for n in weights}, seed, "stratified").next_batch(8, weights))
              for seed in range(20)}
    assert len(orders) > 5  # shuffled: a step's prompts are not sorted by domain


def test_stratified_draws_resume_exactly_and_a_bad_value_is_one_line():
    domains = {name: Named(name) for name in ("a", "b")}
    first = TaskSampler(domains, seed=0, domain_draw="stratified")
    first.next_batch(5, {"a": 0.3, "b": 0.7})
    state = first.state_dict()
    want = [t.domain for t in first.next_batch(5, {"a": 0.3, "b": 0.7})]
    again = TaskSampler(domains, seed=99, domain_draw="stratified")
    again.load_state_dict(state)
    assert [t.domain for t in again.next_batch(5, {"a": 0.3, "b": 0.7})] == want
    with pytest.raises(ConfigError, match=r"^config key 'curriculum.domain_draw'.*stratified"):
        load_config("recipes/default.yaml", ["curriculum.domain_draw=strattified"])


# ---------------------------------------------------------------------------- domain weights


def test_domain_weights_by_hand():
    s = schedule(domain_floor=0.1)
    samples = group("a", 4, domain="arith") + group("c", 8, domain="code", g=1) + group("s", 2, domain="sort", g=2)
    s.update(0, samples)
    w = s.weights
    # L: arith 1/2*1/2 = 0.25, code 0, sort 2/8*6/8 = 0.1875; free share 1 - 3*0.1 = 0.7
    assert w["arith"] == pytest.approx(0.1 + 0.7 * 0.25 / 0.4375)  # 0.5
    assert w["code"] == pytest.approx(0.1)
    assert w["sort"] == pytest.approx(0.1 + 0.7 * 0.1875 / 0.4375)  # 0.4
    assert sum(w.values()) == pytest.approx(1.0)


def test_domain_without_data_counts_as_most_learnable():
    s = schedule(domain_floor=0.0)
    s.update(0, group("a", 4, domain="arith") + group("c", 1, domain="code", g=1))
    w = s.weights
    # arith 0.25, code 7/64, sort unseen 0.25
    assert w["sort"] == pytest.approx(0.25 / (0.5 + 7 / 64)) and w["sort"] == pytest.approx(w["arith"])


def test_no_domain_below_its_floor():
    rng = random.Random(0)
    for _ in range(200):
        base = {d: rng.uniform(0.1, 5) for d in DOMAINS}
        learn = {d: rng.choice([0.0, rng.uniform(0, 0.25)]) for d in DOMAINS}
        floor = rng.uniform(0, 1 / 3)
        w = domain_shares(base, learn, floor)
        assert min(w.values()) >= floor - 1e-12 and sum(w.values()) == pytest.approx(1.0)
    assert domain_shares({"a": 1.0, "b": 3.0}, {"a": 0.0, "b": 0.0}, 0.1) == pytest.approx({"a": 0.3, "b": 0.7})


def test_domain_weights_stay_above_floor_through_training_updates():
    s = schedule(domain_floor=0.15)
    for step in range(20):  # code always solved, sort never: both starve without the floor
        samples = group("a", 4, domain="arith") + group("c", 8, domain="code", g=1) + group("s", 0, domain="sort", g=2)
        s.update(step, samples)
        w = s.weights
    assert w["code"] == pytest.approx(0.15) and w["sort"] == pytest.approx(0.15)
    assert w["arith"] == pytest.approx(0.7)


# ---------------------------------------------------------------------------- levels


def test_levels_unlock_when_mastered_and_are_weighed_by_learnability():
    s = schedule(level_min_groups=4, mastery_pass_rate=0.8)
    new = {lv: Task("arith", f"new{lv}", "", "0", lv) for lv in (1, 2, 3)}
    keep = lambda: [s.task_weight(new[lv]) for lv in (1, 2, 3)]  # noqa: E731
    assert s.frontier() == {"arith": 1, "code": 1}  # sort has one level
    assert keep() == [1.0, 1.0, 0.0]  # the frontier and one above; level 3 locked
    for step in range(3):
        s.update(step, group(f"x{step}", 7))  # 7/8 >= 0.8, but only 3 groups
    assert s.frontier()["arith"] == 1 and keep()[2] == 0.0
    s.update(3, group("x3", 7))
    assert s.frontier()["arith"] == 2
    # L1: 28/32, a=29 b=5: 145/(34*35); L2, L3 unseen: 1/6
    assert keep() == pytest.approx([145 / 1190 * 6, 1.0, 1.0])
    for step in range(4, 12):
        s.update(step, group(f"y{step}", 6, level=2))  # 6/8 < 0.8: the frontier stays
    # L2: 48/64, a=49 b=17: 833/(66*67) is now the best unlocked level
    l1, l2 = 145 / 1190, 833 / 4422
    assert s.frontier()["arith"] == 2 and keep() == pytest.approx([l1 / l2, 1.0, (1 / 6) / l2])
    s.level_index["arith"] = 2
    s.update(12, group("z", 8, level=3))
    assert s.frontier()["arith"] == 3  # the top level: nowhere further to go


# ---------------------------------------------------------------------------- dynamic sampling


def draws(*rounds):
    """A fake sample-and-score callable returning the given groups' win counts, round by round."""
    calls = []

    def draw(k, round_):
        wins = rounds[round_ - 1]
        calls.append((k, round_))
        return [s for i, w in enumerate(wins[:k]) for s in group(f"r{round_}g{i}", w, n=4, g=i)]

    return draw, calls


def first_draw(wins):
    return [s for i, w in enumerate(wins) for s in group(f"first{i}", w, n=4, g=i)]


def test_dynamic_sampling_drops_zero_variance_groups_and_refills():
    draw, calls = draws([2, 0, 1, 4], [3, 3, 3, 3])
    fill = fill_batch(first_draw([4, 1, 0, 2]), draw, group_size=4, max_extra_draws=3)
    # first draw keeps 2 of 4 (keep rate 1/2): asks for 2 / 0.5 = 4 prompts; keeps 2 of them
    assert calls == [(4, 1)]
    assert fill.dropped_groups == 2 + 2 and fill.extra_draws == 1
    assert [s.task.task_id for s in fill.kept[::4]] == ["first1", "first3", "r1g0", "r1g2"]
    assert [s.group for s in fill.kept] == [g for g in range(4) for _ in range(4)]
    assert all(has_signal(fill.kept[i : i + 4]) for i in range(0, 16, 4))
    assert len(fill.drawn) == 32 and sorted({s.group for s in fill.drawn}) == list(range(8))
    m = fill.metrics()
    assert m["dynamic/dropped_groups"] == 4 and m["dynamic/missing_groups"] == 0
    assert m["train/dynamic_sampling_draws"] == m["dynamic/extra_draws"] == 1  # the name #45 asks for


def test_dynamic_sampling_stops_at_its_cap():
    hopeless = [[0, 0, 0, 0]] * 10
    draw, calls = draws(*hopeless)
    fill = fill_batch(first_draw([4, 4, 0, 0]), draw, group_size=4, max_extra_draws=3)
    assert len(calls) == 3 and fill.extra_draws == 3
    assert fill.kept == [] and fill.dropped_groups == 4 + 3 * 4
    draw, calls = draws(*hopeless)
    assert fill_batch(first_draw([0, 0]), draw, group_size=4, max_extra_draws=0).extra_draws == 0 and calls == []


def test_dynamic_sampling_never_returns_zero_variance_groups():
    rng = random.Random(3)
    for _ in range(100):
        rounds = [[rng.choice([0, 0, 4, 1, 2]) for _ in range(6)] for _ in range(4)]
        draw, calls = draws(*rounds)
        fill = fill_batch(first_draw(rounds[0]), draw, group_size=4, max_extra_draws=3, minibatches=8)
        groups = [fill.kept[i : i + 4] for i in range(0, len(fill.kept), 4)]
        assert all(has_signal(g) for g in groups)
        assert len(groups) <= 6 and len(groups) % 2 == 0  # 8 minibatches need whole pairs of 4-sample groups
        assert len(calls) <= 3


# ---------------------------------------------------------------------------- state


def test_state_round_trips_through_json():
    a = schedule(park_after_attempts=8, level_min_groups=2)
    rng = random.Random(0)
    for step in range(6):
        samples = [x for g in range(5) for x in group(f"t{rng.randrange(8)}", rng.choice([0, 3, 8]), g=g,
                                                      domain=rng.choice(list(DOMAINS)))]
        a.update(step, samples)
    b = schedule(park_after_attempts=8, level_min_groups=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() and b.frontier() == a.frontier() and b.metrics() == a.metrics()
    probe = group("t1", 2) + group("t5", 0, g=1, domain="code")
    a.update(6, probe)
    b.update(6, probe)
    assert a.weights == b.weights
    assert [a.task_weight(Task("arith", f"t{i}", "", "0")) for i in range(8)] == [
        b.task_weight(Task("arith", f"t{i}", "", "0")) for i in range(8)
    ]


# ---------------------------------------------------------------------------- seesaw


def test_seesaw_alert_fires_on_a_regression_and_not_on_noise():
    best: dict[str, list] = {}
    assert seesaw_alerts(best, {"arith": 0.50, "code": 0.30}, 10, drop=0.1, action="warn") == []
    assert seesaw_alerts(best, {"arith": 0.62, "code": 0.25}, 20, drop=0.1, action="warn") == []  # code -0.05: noise
    assert best == {"arith": [0.62, 20], "code": [0.30, 10]}
    alerts = seesaw_alerts(best, {"arith": 0.48, "code": 0.28}, 30, drop=0.1, action="rollback")
    assert [(a.name, a.action, a.step) for a in alerts] == [("seesaw", "rollback", 30)]
    assert "arith" in alerts[0].message and alerts[0].data["best"] == 0.62 and alerts[0].data["best_step"] == 20
    assert alerts[0].data["drop"] == pytest.approx(0.14)
    assert seesaw_alerts(best, {"arith": 0.3}, 40, drop=0.0, action="warn") == []  # 0 = off


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize("override, message", [
    ("curriculum.schedule=lernability", "curriculum.schedule"),
    ("curriculum.domain_floor=0.6", "curriculum.domain_floor"),
    ("curriculum.max_extra_draws=-1", "curriculum.max_extra_draws"),
    ("eval.seesaw_action=explode", "eval.seesaw_action"),
    ("eval.best_aggregate=median", "eval.best_aggregate"),
])
def test_config_rejects_bad_curriculum_settings(override, message):
    with pytest.raises(ConfigError, match=message):
        check_names(load_config(None, ["domains={arith: {}, sort: {}}", override]))


def test_multidomain_recipe_loads():
    cfg = load_config("recipes/multidomain.yaml")
    assert len(cfg.domains) >= 3 and cfg.curriculum.schedule == "learnability" and cfg.model.name == "tiny-multi"


# ---------------------------------------------------------------------------- the loop


def test_training_with_curriculum_and_dynamic_sampling_logs_and_checkpoints_it(tiny_model_dir, tmp_path):
    from postrl.cli import main

    run_dir = tmp_path / "run"
    code = main([
        "train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
        "domains={arith: {params: {levels: [1, 2]}}}", "curriculum.schedule=learnability",
        "curriculum.dynamic_sampling=true", "curriculum.max_extra_draws=1", "train.total_steps=2",
        "train.prompts_per_step=4", "train.samples_per_prompt=4", "eval.every_steps=1", "eval.num_problems=4",
        "eval.samples_per_problem=2", "eval.k=[1]", "checkpoint.every_steps=1", "run.progress=false",
        "rl.entropy_coef=0.01", "monitor.spot_check_every_steps=0",
    ])
    assert code == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        assert m["dynamic/extra_draws"] <= 1 and m["dynamic/dropped_groups"] >= 0
        assert m["curriculum/level/arith"] == 1 and 0 <= m["curriculum/learnability/arith"] <= 0.25
    state = CheckpointManager(run_dir).latest_valid().load_state()  # after step 2
    assert set(state["schedule"]) == {"rates", "level_index", "parked", "step", "weights"} and state["schedule"]["step"] == 2
    assert state["schedule"]["rates"]["domains"]["arith"]  # groups recorded from the rollouts
    assert state["eval_best"]["arith"][1] == 1  # best-so-far from the step-1 eval


def test_resumed_curriculum_run_matches_uninterrupted_run(tiny_model_dir, tmp_path):
    """Schedule state, sampler and dynamic-sampling draws all replay exactly after a resume."""
    from safetensors.torch import load_file

    from postrl.cli import main

    args = [
        f"model.name={tiny_model_dir}", "domains={arith: {params: {levels: [1, 2]}}}",
        "curriculum.schedule=learnability", "curriculum.dynamic_sampling=true", "curriculum.max_extra_draws=1",
        "curriculum.park_after_attempts=4", "curriculum.reprobe_every_steps=1", "train.prompts_per_step=4",
        "train.samples_per_prompt=4", "eval.num_problems=2", "eval.samples_per_problem=2", "eval.k=[1]",
        "checkpoint.every_steps=2", "run.progress=false", "rl.entropy_coef=0.01", "monitor.spot_check_every_steps=0",
    ]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["train", "recipes/default.yaml", *args, f"run.dir={whole}", "train.total_steps=4"]) == 0
    assert main(["train", "recipes/default.yaml", *args, f"run.dir={part}", "train.total_steps=2"]) == 0
    assert main(["train", "--resume", str(part), "train.total_steps=4"]) == 0
    want, got = load_file(whole / "final" / "model.safetensors"), load_file(part / "final" / "model.safetensors")
    assert all(torch.equal(want[k], got[k]) for k in want)
    lines = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    keys = ("dynamic/dropped_groups", "curriculum/parked", "pass_rate")
    assert [[m[k] for k in keys] for m in lines(whole)] == [[m[k] for k in keys] for m in lines(part)]
