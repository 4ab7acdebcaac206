"""`postrl score RECIPE --domain NAME RESPONSES.jsonl`: grading without a model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from postrl.cli import main

TESTS_DIR = Path(__file__).resolve().parent
RECIPE = """\
domains:
  gsm:
    type: dataset
    params: {path: gsm.jsonl, prompt: "{question}", system: "Put the answer in \\\\boxed{}.", answer: answer,
             verifier: math, extract: boxed}
    reward: {reward: 1.0, format: 0.1}
  judged:
    type: dataset
    params: {path: gsm.jsonl, prompt: "{question}", answer: answer, verifier: "python:user_rewards:match"}
  arith: {}
"""


def setup(tmp_path: Path, lines: list[dict]) -> tuple[Path, Path]:
    (tmp_path / "gsm.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    shutil.copy(TESTS_DIR / "user_rewards.py", tmp_path / "user_rewards.py")  # next to the recipe
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return recipe, responses


def test_score_prints_one_line_per_response(tmp_path, capsys):
    q = "A farmer has 3 hens and buys 4 more. How many hens?"
    lines = [{"question": q, "answer": "He has 3+4=7.\n#### 7", "response": "3 + 4 = 7, so \\boxed{7}"},
             {"question": q, "answer": "#### 7", "response": "\\boxed{\\frac{14}{2}}"},
             {"question": q, "answer": "#### 7", "response": "\\boxed{8}"},
             {"question": q, "answer": "#### 7", "response": "<think>\\boxed{7}</think> it is seven"}]
    recipe, responses = setup(tmp_path, lines)
    assert main(["score", str(recipe), "--domain", "gsm", str(responses)]) == 0
    captured = capsys.readouterr()
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert [(o["correct"], o["status"], o["extracted"]) for o in out] == [
        (True, "ok", "7"), (True, "ok", "\\frac{14}{2}"), (False, "ok", "8"), (False, "ok", None)]
    assert [o["reward"] for o in out] == [1.1, 1.1, 0.1, 0.0]
    assert out[0]["components"] == {"correct": 1.0, "reward": 1.0, "format": 1.0}
    assert "4 responses: 2 correct, 2 not, 0 could not be verified" in captured.err


def test_score_runs_a_user_reward_from_the_recipes_directory(tmp_path, capsys):
    # a user reward gets the row's columns as they are (TRL's way): here `answer` is "2"
    recipe, responses = setup(tmp_path, [{"question": "q", "answer": "2", "response": "2"},
                                         {"question": "q", "answer": "2", "response": "3"}])
    assert main(["score", str(recipe), "--domain", "judged", str(responses)]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(o["reward"], o["correct"]) for o in out] == [(1.0, True), (0.0, False)]


def test_score_stops_at_a_bad_line_naming_file_line_and_column(tmp_path, capsys):
    recipe, responses = setup(tmp_path, [{"question": "q", "answer": "#### 2", "response": "2"},
                                         {"question": "q", "response": "2"}])
    assert main(["score", str(recipe), "--domain", "gsm", str(responses)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {responses}:2: column 'answer': missing"]
    recipe, responses = setup(tmp_path, [{"question": "q", "answer": "2"}])
    assert main(["score", str(recipe), "--domain", "gsm", str(responses)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {responses}:1: column 'response': missing"
    assert main(["score", str(recipe), "--domain", "arith", str(responses)]) == 2
    assert "score grades data set domains" in capsys.readouterr().err
    assert main(["score", str(recipe), "--domain", "nope", str(responses)]) == 2
