"""The joint-vs-single benchmark's data and arithmetic (benchmarks/joint_vs_single.py, issue 31): the
shipped code problems pass their own asserts through the recipe's verifier in the sandbox and hold
out functions never trained on; the report finds a seesaw and computes its headline in SE."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_curriculum import Named

from postrl.config.loading import load_config
from postrl.curriculum.sampler import TaskSampler
from postrl.curriculum.schedule import SCHEDULES
from postrl.errors import ConfigError
from postrl.loop import train
from postrl.records import Response
from postrl.store.query import query
from postrl.tasks.catalog import build_domains

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _joint_report as report  # noqa: E402
import joint_vs_single as bench  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-joint.yaml"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "recipes" / "data" / name).read_text().splitlines()]


def test_the_shipped_code_problems_pass_their_own_asserts_in_the_sandbox_and_a_wrong_body_does_not():
    cfg = load_config(RECIPE, [])
    code = build_domains(dataclasses.replace(cfg, domains={"code": cfg.domains["code"]}))["code"]
    try:
        tasks = code.heldout(200)[:40]
        fenced = [Response(f"Here it is:\n```python\n{t.answer}\n```", "stop") for t in tasks]
        assert len(tasks) == 40 and all(s.correct for s in code.score(tasks, fenced))
        # the same function with its last operator changed fails at least one of its asserts
        wrong = [Response("```python\n" + t.answer.rstrip()[:-1] + ("2" if t.answer.rstrip()[-1] != "2" else "3")
                          + "\n```", "stop") for t in tasks]
        assert sum(bool(s.correct) for s in code.score(tasks, wrong)) <= 4
    finally:
        code.close()


def test_the_held_out_code_functions_are_never_trained_on():
    test, train = rows("code_test.jsonl"), rows("code_train.jsonl")
    assert len(test) == 200 and len({r["text"] for r in test}) == 200
    assert not {r["text"] for r in test} & {r["text"] for r in train}
    assert all(len(r["test_list"]) == 3 and r["test_list"][0].startswith("assert ") for r in test + train)


def test_the_joint_recipes_word_problems_are_the_1_to_10_set_and_none_held_out_is_trained_on():
    cfg = load_config(RECIPE, [])
    assert cfg.domains["word_problems"].params["path"].endswith("word_problems_1to10_train.jsonl")
    test, train = rows("word_problems_1to10_test.jsonl"), rows("word_problems_1to10_train.jsonl")
    assert (len(test), len(train)) == (200, 1500) and not {r["question"] for r in test} & {r["question"] for r in train}
    for r in test + train:
        operands = [int(w) for w in r["question"].replace(".", " ").split() if w.isdigit()]
        assert len(operands) == 2 and all(1 <= n <= 10 for n in operands), r["question"]
        assert r["answer"].rsplit("#### ", 1)[1] == str(eval(r["answer"].split(" = ")[0].split(" has ", 1)[1]))


def result(correct: list[int], greedy: list[bool] | None = None) -> dict:
    return {"correct": correct, "greedy": greedy or [bool(c) for c in correct]}


def test_the_report_finds_a_single_arms_seesaw_and_the_headline_in_standard_errors():
    n = 100
    base = {"a": result([0] * 90 + [1] * 10), "b": result([1] * 50 + [0] * 50), "ctl": result([1] * 20 + [0] * 80)}
    lifted = result([1] * 40 + [0] * 50 + [1] * 10)        # a: 0.10 -> 0.50
    squeezed = result([0] * 30 + [1] * 20 + [0] * 50)     # b: 0.50 -> 0.20
    results = {
        "base": {"results": base},
        "single_a": {"results": {"a": lifted, "b": squeezed, "ctl": base["ctl"]}},
        "single_b": {"results": {"a": base["a"], "b": result([1] * 60 + [0] * 40), "ctl": base["ctl"]}},
        "joint_curriculum": {"results": {"a": lifted, "b": result([1] * 60 + [0] * 40),
                                         "ctl": result([1] * 19 + [0] * 81)}},
    }
    found = report.seesaws(results, ["a", "b", "ctl"], ["a", "b"])
    assert len(found) == 1 and found[0].startswith("single_a squeezed b: -0.300")
    gains = report.gains_in_se(results, ["a", "b", "ctl"])
    # a: +0.40 with per-problem differences 40 ones and 60 zeros: SE = sqrt(0.4 * 0.6 * 100 / 99 / 100)
    assert abs(gains["a"] - 0.4 / (0.24 * n / (n - 1) / n) ** 0.5) < 1e-9
    assert gains["b"] > 2 and -2 < gains["ctl"] < 0
    min_gain, worst_drop = report.headline(gains, ["a", "b"])
    assert min_gain == min(gains["a"], gains["b"]) and worst_drop == -gains["ctl"] > 0
    assert report.headline({"a": 3.0, "ctl": 0.5}, ["a"]) == (3.0, 0.0)  # no drop: 0
    vs_single = dict((d, (delta, se)) for d, delta, se in report.joint_against_single(results, ["a", "b"]))
    assert vs_single["a"] == (0.0, 0.0) and abs(vs_single["b"][0]) < 1e-12
    # a run of some arms only (--arms): the comparisons skip the single arms that did not run
    partial = {"base": results["base"], "single_b": results["single_b"], "joint_curriculum": results["joint_curriculum"]}
    assert report.seesaws(partial, ["a", "b", "ctl"], ["a", "b"]) == []
    assert [d for d, *_ in report.joint_against_single(partial, ["a", "b"])] == ["b"]


def test_each_arm_is_kept_and_a_changed_setting_runs_it_again(tmp_path):
    arms = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False)
    kept = {"key": arms.key(None, None), "arm": "base", "results": {}, "seconds": 1.0, "load": [0.5], "completions": {}}
    (tmp_path / "base.json").write_text(json.dumps(kept))
    assert arms.run("base", None) == kept  # nothing is trained or measured again
    # more steps: the base model's measurement still holds, a trained arm's does not
    longer = bench.Arms(tmp_path, str(RECIPE), {**bench.QUICK, "steps": 2}, fresh=False)
    assert longer.key(None, None) == arms.key(None, None)
    assert longer.key(["curriculum.schedule=fixed"], None) != arms.key(["curriculum.schedule=fixed"], None)
    assert arms.key(["curriculum.schedule=fixed"], "code") != arms.key(["curriculum.schedule=fixed"], None)
    # a --set override: every trained arm runs again, the base model's measurement holds
    drawn = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False, extra=["curriculum.domain_draw=stratified"])
    assert drawn.key(None, None) == arms.key(None, None)
    assert drawn.key(["curriculum.schedule=fixed"], None) != arms.key(["curriculum.schedule=fixed"], None)
    # other problems: nothing holds
    other = bench.Arms(tmp_path, str(RECIPE), {**bench.QUICK, "problems": 5}, fresh=False)
    assert other.key(None, None) != arms.key(None, None)
    assert bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=True) and not (tmp_path / "base.json").exists()


def test_the_greedy_pass_is_measured_with_greedy_on_the_final_weights_only(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: (None, None))
    monkeypatch.setattr(bench, "Policy", lambda *a: None)
    monkeypatch.setattr(bench, "measure", lambda policy, suites, cfg, tokens, greedy: asked.append(greedy) or {})
    greedy, plain = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False, greedy=True), \
        bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False)
    greedy.measure("a", "m", {}), greedy.measure("b", "m", {}, greedy=False), plain.measure("c", "m", {})
    assert asked == [True, False, False]


def test_an_arm_is_measured_along_its_run_on_the_domains_it_trains(tmp_path, monkeypatch):
    """The equal-completions and completions-to-target readings: the run's checkpoints at the arm's
    `along` steps, pass@1 alone, on its trained domains (a single arm: its own), with the
    completions it had trained on by then."""
    arms = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False)
    asked = []
    monkeypatch.setattr(bench, "checkpoint", lambda run_dir, step: run_dir / f"checkpoint_{step}")
    monkeypatch.setattr(bench, "completions", lambda run_dir, before=None: {"at": before})
    monkeypatch.setattr(arms, "measure", lambda name, model, suites, greedy=True:
                        asked.append((model.name, sorted(suites), greedy)) or {"m": model.name})
    every = bench.arms(arms.trained, 14, seeds=(2,))
    run = tmp_path / "run"
    assert arms.along("joint_uniform", every["joint_uniform"], run) == {"along": [
        {"step": 5, "completions": {"at": 5}, "results": {"m": "checkpoint_5"}},
        {"step": 10, "completions": {"at": 10}, "results": {"m": "checkpoint_10"}}]}
    trained = sorted(arms.trained)
    assert asked == [("checkpoint_5", trained, False), ("checkpoint_10", trained, False)]
    asked.clear()
    assert [p["step"] for p in arms.along("single_code", every["single_code"], run)["along"]] == [5]
    assert asked == [("checkpoint_5", ["code"], False)]
    assert arms.along("seed", every["joint_curriculum_seed2"], run) == {}  # no readings along its run


def test_an_arm_stopped_while_measured_keeps_its_finished_training_and_only_that(tmp_path):
    arms = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False)
    overrides = ["curriculum.schedule=fixed"]
    run_dir = tmp_path / "runs" / "joint_uniform"
    record = {"key": arms.key(overrides, None), "train_seconds": 5.0, "load": [0.5, 0.6]}
    (tmp_path / "joint_uniform.trained.json").write_text(json.dumps(record))
    assert arms.trained_run("joint_uniform", record["key"], run_dir) is None  # no final weights: train again
    (run_dir / "final").mkdir(parents=True)
    assert arms.trained_run("joint_uniform", record["key"], run_dir) == record
    assert arms.trained_run("joint_uniform", arms.key(overrides, "code"), run_dir) is None  # other settings
    assert bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=True)
    assert not (tmp_path / "joint_uniform.trained.json").exists()


def test_an_arms_record_holds_what_the_report_needs_of_its_run(tmp_path):
    """The full size's records are committed and the next sitting has no run directories: the
    seesaw alerts, the curriculum's steps and the curves travel in the record itself."""
    from rich.console import Console

    from postrl.monitor.alerts import Alert, AlertLog

    run_dir = tmp_path / "run"
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "curriculum/weight/a": w, "curriculum/weight/b": 1 - w, "batch/a": w,
                            "batch/b": 1 - w, "pass_rate/a": 0.1 * s, "pass_rate/b": 0.5}) + "\n"
                for s, w in ((0, 0.5), (1, 0.75))))
    for step, p in ((0, 0.1), (2, 0.4)):
        (run_dir / "eval" / f"step_{step}.json").write_text(json.dumps({"a": {"pass@1": p}, "ctl": {"pass@1": 0.2}}))
    AlertLog(run_dir, Console(file=open("/dev/null", "w"))).record(
        [Alert(2, "seesaw", "ctl dropped"), Alert(2, "kl_spike", "not a seesaw")])
    record = json.loads(json.dumps(bench.run_record(run_dir, ["a", "b"])))  # as kept on disk
    assert record["seesaw_alerts"] == [{"step": 2, "message": "ctl dropped"}]
    assert record["evals"] == {"a": [[0, 0.1], [2, 0.4]], "ctl": [[0, 0.2], [2, 0.2]]}
    assert record["weights"] == {"a": [[0, 0.5], [1, 0.75]], "b": [[0, 0.5], [1, 0.25]]}
    assert record["story"][2:] == ["| 0 | 0.50 / 0.50 / 0.00 | 0.50 / 0.50 / 0.50 |",
                                   "| 1 | 0.75 / 0.75 / 0.10 | 0.25 / 0.25 / 0.50 |"]
    import shutil

    shutil.rmtree(run_dir)  # the plots come from the record alone
    report.plot(record, tmp_path / "joint")
    for suffix in ("eval", "weights"):
        svg = (tmp_path / f"joint-{suffix}.svg").read_text()
        assert svg.startswith("<svg") and "Joint curriculum run" in svg


def test_the_joint_curriculum_under_several_seeds_is_reported_run_by_run_and_pooled():
    assert bench.arms(["a"], 3, (1, 2))["joint_curriculum_seed2"] == bench.Arm(("seed=2", "curriculum.schedule=learnability"))
    assert not any(arm.startswith("joint_curriculum_seed") for arm in bench.arms(["a"], 3))
    base = {"a": result([0] * 100)}
    results = {"base": {"results": base},
               "joint_curriculum": {"results": {"a": result([1] * 40 + [0] * 60)}},   # +0.40
               "single_a": {"results": {"a": result([1] * 90 + [0] * 10)}},           # not a seed: left out
               "joint_curriculum_seed1": {"results": {"a": result([0] * 80 + [1] * 20)}}}  # +0.20, other problems
    s = report.over_seeds(results, ["a"])["a"]
    assert s["gains"] == [0.4, 0.2] and abs(s["mean"] - 0.3) < 1e-12
    assert abs(s["seed_se"] - 0.1) < 1e-12  # stdev(0.4, 0.2) / sqrt(2)
    # per problem the two runs' mean: 40 at 0.5, 40 at 0, 20 at 0.5 -> 60 problems at 0.5, 40 at 0
    assert abs(s["pooled_se"] - (0.25 * 0.6 * 0.4 * 100 / 99 / 100) ** 0.5) < 1e-12
    assert math.isnan(report.over_seeds({k: results[k] for k in ("base", "joint_curriculum")}, ["a"])["a"]["seed_se"])


# ---------------------------------------------------------------------------- issue 46: sequential arms, equal completions


def test_stages_split_the_steps_nearly_evenly_and_name_their_steps():
    assert bench.stage_lengths(14, 3) == [5, 5, 4]  # 14/3 = 4.67 -> 5, the last what is left
    assert bench.stage_lengths(13, 3) == [4, 4, 5]  # 4.33 -> 4
    assert bench.stage_lengths(10, 3) == [3, 3, 4] and bench.stage_lengths(3, 3) == [1, 1, 1]
    with pytest.raises(ValueError, match="2 steps cannot make 3 stages"):
        bench.stage_lengths(2, 3)
    assert bench.stage_bounds(14, ("a", "b", "c")) == [("a", 0, 5), ("b", 5, 10), ("c", 10, 14)]


def test_the_sequential_schedule_draws_only_its_stages_domain_and_resumes_at_its_step():
    schedule = bench.SequentialSchedule({"a": 1.0, "b": 1.0, "c": 1.0}, order=("c", "a", "b"), steps=7)  # 2, 2, 3 steps
    sampler = TaskSampler({n: Named(n) for n in "abc"}, seed=0, domain_draw="stratified")
    drawn = []
    for step in range(7):
        drawn.append({t.domain for t in sampler.next_batch(4, schedule.weights, schedule.task_weight)})
        schedule.update(step, [])
    assert drawn == [{"c"}, {"c"}, {"a"}, {"a"}, {"b"}, {"b"}, {"b"}]
    assert schedule.metrics() == {"curriculum/weight/c": 0.0, "curriculum/weight/a": 0.0, "curriculum/weight/b": 1.0}
    midway = bench.SequentialSchedule({"a": 1.0, "b": 1.0, "c": 1.0}, order=("c", "a", "b"), steps=7)
    midway.update(2, [])  # after step 2: step 3 is a's
    again = bench.SequentialSchedule({"a": 1.0, "b": 1.0, "c": 1.0}, order=("c", "a", "b"), steps=7)
    again.load_state_dict(midway.state_dict())
    assert again.weights == {"c": 0.0, "a": 1.0, "b": 0.0} and again.state_dict() == {"step": 3}
    with pytest.raises(ValueError, match="not the run's domains"):
        bench.SequentialSchedule({"a": 1.0, "b": 1.0}, order=("a", "c"), steps=4)


def test_every_arm_keeps_a_checkpoint_each_third_and_reads_its_own_along_the_run(tmp_path):
    every = bench.arms(["wp", "lc", "code"], 14, seeds=(2,))
    assert list(every) == ["joint_curriculum", "joint_uniform", "single_wp", "single_lc", "single_code", "sequential",
                           "sequential_rev", "joint_curriculum_seed2"]
    assert every["sequential"].stages == ("wp", "lc", "code") and every["sequential_rev"].stages == ("code", "lc", "wp")
    assert every["sequential"].overrides[0] == "curriculum.schedule=sequential"
    # 14 steps: checkpoints at 5 and 10, both kept: the stages' ends, the joint arms' readings along the run
    for arm in ("sequential_rev", "joint_uniform", "joint_curriculum", "single_lc"):
        assert {"checkpoint.every_steps=5", "checkpoint.keep_last=2"} <= set(every[arm].overrides)
    assert every["joint_uniform"].along == every["joint_curriculum"].along == (5, 10)
    assert every["joint_curriculum"].overrides[0] == "curriculum.schedule=learnability"
    # a domain alone after the first stage's 5 steps: about its completions in a joint arm
    assert (every["single_lc"].only, every["single_lc"].along) == ("lc", (5,))
    assert every["sequential"].along == every["joint_curriculum_seed2"].along == ()  # stages / final weights only
    assert bench.arms(["wp", "lc", "code"], 3)["joint_uniform"].along == (1, 2)  # --quick: a step a third
    arms = bench.Arms(tmp_path, str(RECIPE), bench.QUICK, fresh=False)
    seq, rev = every["sequential"], every["sequential_rev"]
    assert arms.key(seq.overrides, None, seq.stages) != arms.key(rev.overrides, None, rev.stages)  # the order counts


@pytest.mark.parametrize("arm", [
    ("curriculum.schedule=fixed", "eval.every_steps=0", "eval.at_start=false"),  # the single arms
    ("curriculum.schedule=learnability", "eval.every_steps=1", "eval.at_start=true"),  # the joint arms
])
def test_a_run_of_k_steps_is_the_first_k_steps_of_a_longer_run(tiny_model_dir, tmp_path, arm):
    """What the readings along a run rest on: a run's checkpoint after k steps stands for the domains
    trained for k steps (a single arm's after a third: what training the domain alone that long
    gives). A 2-step run's weights are, bit for bit, a 3-step run's after its second step (its
    checkpoint there; the short run writes none), with an arm's settings: a fixed mixture and no
    eval, or the learnability curriculum with in-run evals."""
    def run(steps: int, name: str, every: int) -> Path:
        cfg = load_config("recipes/default.yaml", [
            f"model.name={tiny_model_dir}", "domains={arith: {}, sort: {}}", *arm,
            f"train.total_steps={steps}", "train.prompts_per_step=2", "train.samples_per_prompt=2",
            "train.minibatches=1", "eval.num_problems=2", f"checkpoint.every_steps={every}",
            "run.progress=false", "monitor.spot_check_every_steps=0", f"run.dir={tmp_path / name}",
            "rl.entropy_coef=0.01"])  # a gradient at every step, even where every group scores alike
        train(cfg, log=lambda *_: None)
        return tmp_path / name

    short, long = run(2, "short", 0), run(3, "long", 2)
    short_w, at_2, final = (load_file(d / "model.safetensors")
                            for d in (short / "final", bench.checkpoint(long, 2), long / "final"))
    assert short_w.keys() == at_2.keys() and all(torch.equal(short_w[k], at_2[k]) for k in short_w)
    base = load_file(tiny_model_dir / "model.safetensors")
    assert all(not torch.equal(at_2[k], final[k]) and not torch.equal(base[k], at_2[k]) for k in at_2)  # each step moved them


def test_a_sequential_run_trains_the_stages_in_turn_with_one_optimiser(tiny_model_dir, tmp_path):
    """Real training on a tiny model: the rollouts of each step are its stage's domain only, and the
    optimiser goes on across the stage's end (its step count doubles from the first stage's
    checkpoint to the second's, where a fresh optimiser would start again from 0)."""
    run_dir = tmp_path / "run"
    cfg = load_config("recipes/default.yaml", [
        f"model.name={tiny_model_dir}", "domains={arith: {}, sort: {}}", "curriculum.schedule=sequential",
        "train.total_steps=4", "train.prompts_per_step=2", "train.samples_per_prompt=2", "train.minibatches=1",
        "eval.every_steps=0", "eval.at_start=false", "eval.num_problems=2", "checkpoint.every_steps=2",
        "run.progress=false", "monitor.spot_check_every_steps=0", f"run.dir={run_dir}"])
    with bench.in_turn(("sort", "arith"), 4):
        train(cfg, log=lambda *_: None)
    with pytest.raises(ConfigError, match="unknown curriculum schedule"):
        SCHEDULES.get("sequential")  # registered for that run only
    rows = query(run_dir, "SELECT step, domain, count(*) FROM rollouts GROUP BY step, domain ORDER BY step").rows
    assert [(int(s), d, int(n)) for s, d, n in rows] == [(0, "sort", 4), (1, "sort", 4), (2, "arith", 4), (3, "arith", 4)]
    assert bench.completions(run_dir) == {"arith": 8, "sort": 8}
    assert bench.completions(run_dir, before=3) == {"arith": 4, "sort": 8}  # what it had trained on by step 3

    def adam_steps(step: int) -> float:
        state = torch.load(bench.checkpoint(run_dir, step).parent / "state.pt", weights_only=False)
        return float(next(iter(state["learner"]["optimizer"]["state"].values()))["step"])

    assert adam_steps(2) == 2 and adam_steps(4) == 4
    with pytest.raises(FileNotFoundError, match="no intact checkpoint of step 3"):
        bench.checkpoint(run_dir, 3)  # never a neighbour's weights
    times = bench.step_times(run_dir)
    assert {"time/sample_s", "time/reward_s", "time/update_s"} <= set(times) and all(v >= 0 for v in times.values())


def stage_record(after_first: dict, final: dict) -> dict:
    return {"arm": "sequential", "results": final,
            "stages": [{"domain": "a", "steps": [0, 5], "results": after_first}, {"domain": "b", "steps": [5, 10]}]}


def test_the_report_reads_forgetting_from_a_sequential_arms_stages(tmp_path):
    base = {"a": result([0] * 100), "b": result([0] * 100)}
    after_a = {"a": result([1] * 60 + [0] * 40), "b": result([0] * 100)}    # a: 0 -> 0.60
    final = {"a": result([1] * 20 + [0] * 80), "b": result([1] * 50 + [0] * 50)}  # a falls to 0.20, b 0.50
    record = stage_record(after_a, final)
    assert [d for d, _, r in report.stage_results(record)] == ["a", "b"] and report.stage_results(record)[1][2] is final
    [(d, before, end, delta, se)] = report.forgetting(record)
    assert (d, before, end) == ("a", 0.6, 0.2) and abs(delta + 0.4) < 1e-12
    # per problem 40 of -1 and 60 of 0: mean -0.4, SE = sqrt(0.24 * 100 / 99 / 100)
    assert abs(se - (0.24 / 99) ** 0.5) < 1e-12
    lines = report.stage_table(record, base, ["a", "b"], ["a"])
    assert lines[0] == "| after stage | a | b (control) |"
    # a after its stage: 0.60 over base 0 with SE sqrt(0.24/99): +12.2 SE; b untouched: 0
    assert lines[2] == "| a (steps 0-4) | 0.600 (+12.2 SE) | 0.000 (+0.0 SE) |"
    assert lines[3].startswith("| b (steps 5-9) | 0.200 (")
    report.plot_stages(record, base, tmp_path / "stages.svg")
    assert "sequential: held-out pass@1 after each stage" in (tmp_path / "stages.svg").read_text()


def test_the_worst_domain_margin_pairs_one_domain_and_adds_two_in_quadrature():
    base = {"a": result([0] * 100), "b": result([0] * 100)}
    joint = {"a": result([1] * 30 + [0] * 70), "b": result([1] * 40 + [0] * 60)}    # worst: a, +0.30
    seq_a = {"a": result([1] * 10 + [0] * 90), "b": result([1] * 50 + [0] * 50)}    # worst: a, +0.10
    seq_b = {"a": result([1] * 50 + [0] * 50), "b": result([0] * 90 + [1] * 10)}    # worst: b, +0.10
    results = {"base": {"results": base}, "joint_curriculum": {"results": joint},
               "s1": {"results": seq_a}, "s2": {"results": seq_b}}
    d1, d2, delta, se = report.worst_margin(results, "joint_curriculum", "s1", ["a", "b"])
    # same domain: per problem 20 of +1 (joint right, s1 wrong), 80 of 0 -> +0.2, SE sqrt(0.16 / 99)
    assert (d1, d2) == ("a", "a") and abs(delta - 0.2) < 1e-12 and abs(se - (0.16 / 99) ** 0.5) < 1e-12
    d1, d2, delta, se = report.worst_margin(results, "joint_curriculum", "s2", ["a", "b"])
    # a +0.30 (SE sqrt(0.21/99)) against b +0.10 (SE sqrt(0.09/99)): +0.2, SE sqrt(0.30/99)
    assert (d1, d2) == ("a", "b") and abs(delta - 0.2) < 1e-12 and abs(se - (0.30 / 99) ** 0.5) < 1e-12


def test_joint_against_single_at_equal_completions_reads_the_single_arms_first_point_along_their_run():
    joint = {"a": result([1] * 30 + [0] * 70), "b": result([1] * 50 + [0] * 50)}
    results = {"joint_curriculum": {"results": joint, "completions": {"a": 296, "b": 304}},
               "single_a": {"results": {"a": result([1] * 90 + [0] * 10)}, "along": [
                   {"step": 5, "results": {"a": result([1] * 40 + [0] * 60)}, "completions": {"a": 320}}]},
               "single_b": {"results": {"b": result([1] * 90 + [0] * 10)}}}  # b not measured along its run
    [(d, n_single, n_joint, delta, se)] = report.equal_completions(results, ["a", "b"], "joint_curriculum")
    # the joint's 30 right are among single_a's first 40: per problem 10 of -1 -> -0.10, SE sqrt(0.09/99)
    assert (d, n_single, n_joint) == ("a", 320, 296) and abs(delta + 0.1) < 1e-12
    assert abs(se - (0.09 / 99) ** 0.5) < 1e-12
    assert report.equal_completions(results, ["a", "b"], "joint_uniform") == []  # that arm did not run


def test_the_curriculum_against_uniform_reads_when_each_reached_its_target():
    size = {"steps": 14, "prompts": 8, "samples": 8}

    def at(n: int) -> dict:  # n of 100 right on domain a
        return {"results": {"a": result([1] * n + [0] * (100 - n))}}

    def along(final: int, *points: tuple[int, int]) -> dict:  # (step, n right) measured along the run
        return at(final) | {"along": [{"step": k, **at(n)} for k, n in points]}

    results = {"joint_curriculum": along(40, (5, 10), (10, 30)), "joint_uniform": along(35, (10, 25), (5, 20))}
    points = report.reach_points(results, "joint_curriculum", size)
    assert [n for n, _ in points] == [320, 640, 896]  # in order of steps, whatever the records' order
    assert report.first_reach(points, "a", 0.28) == 640  # 0.10, 0.30: at 640 completions
    assert report.first_reach(report.reach_points(results, "joint_uniform", size), "a", 0.28) == 896  # .20 .25 .35
    assert report.first_reach(points, "a", 0.5) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "REACH", {"a": 0.28})
        assert report.report_reach(results, ["a"], size) == (1, 1)
        results["joint_uniform"] = along(35, (10, 25), (5, 30))  # the mixture there at 320: the curriculum later
        assert report.report_reach(results, ["a"], size) == (0, 1)
        results["joint_uniform"] = at(35)
        assert report.report_reach(results, ["a"], size) is None  # the mixture not read along its run


def test_an_arms_time_is_split_from_its_metrics_and_the_rest_is_named(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in [
        {"step": 0, "time/sample_s": 60.0, "time/reward_s": 12.0, "time/reward_tail_s": 6.0, "time/update_s": 120.0},
        {"step": 1, "time/sample_s": 30.0, "time/reward_s": 6.0, "time/reward_tail_s": 0.0, "time/update_s": 90.0,
         "loss": 0.5}]))
    times = bench.step_times(tmp_path)
    assert times == {"time/sample_s": 90.0, "time/reward_s": 18.0, "time/reward_tail_s": 6.0, "time/update_s": 210.0}
    record = {"times": {**times, "train_s": 600.0, "measure_s": 300.0}}
    # the rest of training: 600 - 90 - 6 - 210 = 294 s = 4.9 min
    assert report.time_split(record) == ("sampling 1.5, scoring 0.1, update 3.5, in-run eval, checkpoints, loading 4.9, "
                                        "measurement 5.0 min (scoring 0.3 min in all)")
    assert report.time_split({"seconds": 1.0}).startswith("not recorded")
    record["times"]["time/eval_s"] = 120.0  # a run that timed its in-run evals: 294 - 120 = 174 s left
    assert report.time_split(record) == ("sampling 1.5, scoring 0.1, update 3.5, in-run eval 2.0, checkpoints, loading, "
                                        "last eval 2.9, measurement 5.0 min (scoring 0.3 min in all)")


def test_the_base_measurement_is_one_shared_record_and_an_older_copy_is_taken_up(tmp_path):
    shared = tmp_path / "shared" / "base.json"
    arms = bench.Arms(tmp_path / "out", str(RECIPE), bench.QUICK, fresh=False, base=shared)
    kept = {"key": arms.key(None, None), "arm": "base", "results": {}, "seconds": 1.0, "load": [0.5], "completions": {}}
    (tmp_path / "out" / "base.json").write_text(json.dumps(kept))  # the layout before: a copy in OUT
    assert arms.run("base", None) == kept and json.loads(shared.read_text()) == kept
    (tmp_path / "out" / "base.json").unlink()
    other = bench.Arms(tmp_path / "other", str(RECIPE), bench.QUICK, fresh=True, base=shared)  # another OUT
    assert other.run("base", None) == kept and shared.is_file()  # --fresh forgets OUT's arms, not the shared base
    assert other.kept("base", "another measurement") is None
