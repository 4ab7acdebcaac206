"""Resuming with another set of domains than the checkpoint's (a domain added to the recipe or
taken out between sittings): the curriculum keeps its state for the domains still trained, a new
domain starts as at a run's start, a dropped one is gone, one line says which; a schedule whose
state is not per domain is refused with one line."""

import json
from pathlib import Path

import pytest

from postrl.cli import main
from postrl.curriculum.schedule import SCHEDULES, FixedSchedule, LearnabilitySchedule
from postrl.store.query import query

TWO = "domains={a: {type: arith, params: {levels: [1]}}, b: {type: arith, params: {levels: [1, 2]}}}"
ARGS = [
    "curriculum.domain_draw=stratified", "train.prompts_per_step=3", "train.samples_per_prompt=2",
    "train.minibatches=1", "eval.every_steps=0", "eval.num_problems=2", "eval.samples_per_problem=2", "eval.k=[1]",
    "checkpoint.every_steps=2", "run.progress=false", "monitor.spot_check_every_steps=0",
]


def first_sitting(tmp_path, model_dir, schedule: str):
    run_dir = tmp_path / "run"
    code = main(["train", "recipes/default.yaml", f"model.name={model_dir}", TWO, f"curriculum.schedule={schedule}",
                 *ARGS, "train.total_steps=2", f"run.dir={run_dir}"])
    assert code == 0
    return run_dir


def domains_by_step(run_dir) -> dict[int, set[str]]:
    rows = query(run_dir, "SELECT DISTINCT step, domain FROM rollouts ORDER BY step").rows
    out: dict[int, set[str]] = {}
    for step, domain in rows:
        out.setdefault(int(step), set()).add(domain)
    return out


def resumed(tmp_path, model_dir, schedule: str, capsys, domains: str) -> tuple[Path, str]:
    """The first sitting, then `--resume` to step 4 with `domains` changed: (its run dir, what it printed)."""
    run_dir = first_sitting(tmp_path, model_dir, schedule)
    capsys.readouterr()
    code = main(["train", "--resume", str(run_dir), domains, "train.total_steps=4"])
    out = capsys.readouterr().out
    assert code == 0
    return run_dir, out


def metric_lines(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("schedule", ["fixed", "learnability"])
def test_a_domain_added_on_resume_is_trained_and_sampled(tiny_model_dir, tmp_path, capsys, schedule):
    run_dir, out = resumed(tmp_path, tiny_model_dir, schedule, capsys,
                           "domains.c={type: arith, params: {levels: [1, 2]}}")
    assert ("resuming with other domains than the checkpoint's: added c; dropped none "
            "(a new domain starts from its recipe weight, a dropped one's curriculum state is discarded)") in out
    drawn = domains_by_step(run_dir)
    assert [drawn[0], drawn[1]] == [{"a", "b"}] * 2 and "c" in drawn[2] and "c" in drawn[3]
    after = metric_lines(run_dir)[2:]
    if schedule == "fixed":  # weights 1, 1, 1 drawn stratified: one prompt of three each
        assert [drawn[2], drawn[3]] == [{"a", "b", "c"}] * 2
        assert [m["batch/c"] for m in after] == [pytest.approx(1 / 3)] * 2
    else:
        assert all(m["curriculum/level/c"] == 1 for m in after)  # the new domain's levels gated from its easiest
        assert all("curriculum/learnability/b" in m for m in after)  # b's record carried on
    assert (run_dir / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("schedule", ["fixed", "learnability"])
def test_a_domain_dropped_on_resume_is_no_longer_drawn(tiny_model_dir, tmp_path, capsys, schedule):
    run_dir, out = resumed(tmp_path, tiny_model_dir, schedule, capsys, "domains={a: {type: arith, params: {levels: [1]}}}")
    assert "resuming with other domains than the checkpoint's: added none; dropped b" in out
    assert domains_by_step(run_dir) == {0: {"a", "b"}, 1: {"a", "b"}, 2: {"a"}, 3: {"a"}}
    assert not any(k.endswith("/b") for m in metric_lines(run_dir)[2:] for k in m)


def test_every_domain_replaced_on_resume_trains_the_new_ones(tiny_model_dir, tmp_path, capsys):
    """The symptom of issue 46: a fixed schedule's checkpointed weights named only domains gone
    from the recipe, and the first draw found all weights zero."""
    run_dir = first_sitting(tmp_path, tiny_model_dir, "fixed")
    code = main(["train", "--resume", str(run_dir), "domains={c: {type: arith, params: {levels: [2]}}}",
                 "train.total_steps=3"])
    assert code == 0
    assert "added c; dropped a, b" in capsys.readouterr().out
    assert domains_by_step(run_dir)[2] == {"c"}


class StepOnly:
    """A schedule whose state is not per domain: it cannot say what a new domain's would be."""

    def __init__(self, weights, **_):
        self.weights, self.step = dict(weights), 0

    def update(self, step, samples):
        self.step = step + 1

    def task_weight(self, task):
        return 1.0

    def metrics(self):
        return {}

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def test_a_schedule_without_per_domain_state_refuses_other_domains_in_one_line(tiny_model_dir, tmp_path, capsys):
    SCHEDULES.add("step_only", StepOnly)
    try:
        run_dir = first_sitting(tmp_path, tiny_model_dir, "step_only")
        config = (run_dir / "config.yaml").read_text()
        capsys.readouterr()
        code = main(["train", "--resume", str(run_dir), "domains.c={type: arith}", "train.total_steps=4"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.strip().splitlines() == [
            f"error: cannot resume {run_dir} with other domains than its checkpoint's (added c; dropped none): "
            "curriculum.schedule 'step_only' keeps no per-domain state to carry over; resume with the "
            "checkpoint's domains a, b"]
        assert (run_dir / "config.yaml").read_text() == config  # so a plain resume is what the line says
        assert main(["train", "--resume", str(run_dir), "train.total_steps=3"]) == 0
        assert domains_by_step(run_dir)[2] == {"a", "b"}
    finally:
        SCHEDULES.remove("step_only")


# ---------------------------------------------------------------------------- carry_over, by hand


def test_fixed_carries_the_kept_domains_weights_and_takes_the_recipes_for_new_ones():
    schedule = FixedSchedule({"b": 5.0, "c": 3.0})
    assert schedule.carry_over({"weights": {"a": 2.0, "b": 1.0}}) == {"weights": {"b": 1.0, "c": 3.0}}


def test_learnability_carries_kept_records_and_works_the_weights_out_again():
    from postrl.config.schema import CurriculumConfig

    settings = CurriculumConfig(schedule="learnability", domain_floor=0.05)
    schedule = LearnabilitySchedule({"a": 1.0, "c": 1.0}, levels={"a": [1], "c": [1, 2]}, settings=settings)
    state = {  # written by a run of a and b (b with levels 1 and 2, at its second)
        "rates": {"problems": [["a/1+1=", [[4, 1]]], ["b/9+9=", [[4, 0]]]],
                  "families": {"a/L1": [[4, 1]], "b/L1": [[4, 0]]}, "domains": {"a": [[4, 1]], "b": [[4, 0]]}},
        "level_index": {"b": 1}, "parked": {"b/9+9=": 1}, "step": 2, "weights": {"a": 0.6, "b": 0.4},
    }
    carried = schedule.carry_over(state)
    # a: p = 1/4, L = 3/16; c: no record, L = 1/4 as any domain's at a run's start; sum 7/16
    assert carried["weights"] == {"a": pytest.approx(0.05 + 0.9 * 3 / 7), "c": pytest.approx(0.05 + 0.9 * 4 / 7)}
    assert carried["level_index"] == {"c": 0}  # b's gone, c at its easiest level
    assert carried["rates"]["families"] == {"a/L1": [[4, 1]]} and carried["rates"]["domains"] == {"a": [[4, 1]]}
    assert carried["rates"]["problems"] == state["rates"]["problems"]  # by task id: they age out
    assert carried["parked"] == {"b/9+9=": 1} and carried["step"] == 2
    schedule.load_state_dict(carried)
    assert schedule.frontier() == {"c": 1}
