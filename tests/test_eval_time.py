"""`time/eval_s`: the wall seconds of the in-run eval made before a step, in that step's metrics
line (eval N, eval/step_N.json, runs before step N), kept across a resume by the checkpoint."""

import json
import time

import postrl.run as run_module
from postrl.cli import main

PAUSE_S = 0.25
ARGS = [
    "train.total_steps=5", "eval.every_steps=2", "eval.at_start=true", "checkpoint.every_steps=2",
    "train.prompts_per_step=2", "train.samples_per_prompt=2", "train.minibatches=1", "eval.num_problems=2",
    "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false", "monitor.spot_check_every_steps=0",
]


def eval_times(run_dir) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["time/eval_s"] for m in lines if "time/eval_s" in m}


def test_each_in_run_eval_is_timed_in_its_steps_line_and_a_resume_keeps_it(tiny_model_dir, tmp_path, monkeypatch):
    real = run_module.evaluate

    def slow(*args, **kwargs):  # every eval takes at least PAUSE_S, so its time is told from none
        time.sleep(PAUSE_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "evaluate", slow)
    run_dir = tmp_path / "run"
    assert main(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}", *ARGS]) == 0
    timed = eval_times(run_dir)
    # at start, after steps 1 and 3; the final eval (step_5, after the last step) is in no step's line
    assert sorted(int(p.stem[5:]) for p in (run_dir / "eval").glob("step_*.json")) == [0, 2, 4, 5]
    assert sorted(timed) == [0, 2, 4]
    assert all(PAUSE_S <= s < 30 for s in timed.values()), timed
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]  # no line of its own: consumers see one line a step

    # checkpoint 4 was written after eval 4: a run resumed from it logs that eval's time at step 4,
    # though it does not run the eval again
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert eval_times(run_dir) == timed
