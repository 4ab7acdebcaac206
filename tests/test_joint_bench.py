"""The joint-vs-single benchmark's data and arithmetic (benchmarks/joint_vs_single.py, issue 31): the
shipped code problems pass their own asserts through the recipe's verifier in the sandbox and hold
out functions never trained on; the report finds a seesaw and computes its headline in SE."""

import dataclasses
import json
import math
import sys
from pathlib import Path

from postrl.config.loading import load_config
from postrl.records import Response
from postrl.tasks.catalog import build_domains

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
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
    found = bench.seesaws(results, ["a", "b", "ctl"], ["a", "b"])
    assert len(found) == 1 and found[0].startswith("single_a squeezed b: -0.300")
    gains = bench.gains_in_se(results, ["a", "b", "ctl"])
    # a: +0.40 with per-problem differences 40 ones and 60 zeros: SE = sqrt(0.4 * 0.6 * 100 / 99 / 100)
    assert abs(gains["a"] - 0.4 / (0.24 * n / (n - 1) / n) ** 0.5) < 1e-9
    assert gains["b"] > 2 and -2 < gains["ctl"] < 0
    min_gain, worst_drop = bench.headline(gains, ["a", "b"])
    assert min_gain == min(gains["a"], gains["b"]) and worst_drop == -gains["ctl"] > 0
    assert bench.headline({"a": 3.0, "ctl": 0.5}, ["a"]) == (3.0, 0.0)  # no drop: 0
    vs_single = dict((d, (delta, se)) for d, delta, se in bench.joint_against_single(results, ["a", "b"]))
    assert vs_single["a"] == (0.0, 0.0) and abs(vs_single["b"][0]) < 1e-12
    # a run of some arms only (--arms): the comparisons skip the single arms that did not run
    partial = {"base": results["base"], "single_b": results["single_b"], "joint_curriculum": results["joint_curriculum"]}
    assert bench.seesaws(partial, ["a", "b", "ctl"], ["a", "b"]) == []
    assert [d for d, *_ in bench.joint_against_single(partial, ["a", "b"])] == ["b"]


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
    bench.plot(record, tmp_path / "joint")
    for suffix in ("eval", "weights"):
        svg = (tmp_path / f"joint-{suffix}.svg").read_text()
        assert svg.startswith("<svg") and "Joint curriculum run" in svg


def test_the_joint_curriculum_under_several_seeds_is_reported_run_by_run_and_pooled():
    assert bench.arms(["a"], (1, 2))["joint_curriculum_seed2"] == (["seed=2", "curriculum.schedule=learnability"], None)
    assert not any(arm.startswith("joint_curriculum_seed") for arm in bench.arms(["a"]))
    base = {"a": result([0] * 100)}
    results = {"base": {"results": base},
               "joint_curriculum": {"results": {"a": result([1] * 40 + [0] * 60)}},   # +0.40
               "single_a": {"results": {"a": result([1] * 90 + [0] * 10)}},           # not a seed: left out
               "joint_curriculum_seed1": {"results": {"a": result([0] * 80 + [1] * 20)}}}  # +0.20, other problems
    s = bench.over_seeds(results, ["a"])["a"]
    assert s["gains"] == [0.4, 0.2] and abs(s["mean"] - 0.3) < 1e-12
    assert abs(s["seed_se"] - 0.1) < 1e-12  # stdev(0.4, 0.2) / sqrt(2)
    # per problem the two runs' mean: 40 at 0.5, 40 at 0, 20 at 0.5 -> 60 problems at 0.5, 40 at 0
    assert abs(s["pooled_se"] - (0.25 * 0.6 * 0.4 * 100 / 99 / 100) ** 0.5) < 1e-12
    assert math.isnan(bench.over_seeds({k: results[k] for k in ("base", "joint_curriculum")}, ["a"])["a"]["seed_se"])
