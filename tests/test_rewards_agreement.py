"""Agreement statistics and the reward-check / verify commands."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from postrl.cli import main
from postrl.rewards.checks.agreement import agreement, cohen_kappa

DATA = Path(__file__).resolve().parents[1] / "postrl" / "data"


def test_kappa_hand_worked():
    # 10 examples. human: 6 yes / 4 no; reward: 5 yes / 5 no; they agree on 4 yes + 3 no = 7.
    human = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    reward = [1, 1, 1, 1, 0, 0, 1, 0, 0, 0]
    # p_o = 0.7; p_e = 0.6*0.5 + 0.4*0.5 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    a = agreement(human, reward)
    assert a.accuracy == 0.7
    assert a.kappa == pytest.approx(0.4, abs=1e-12)
    assert a.labels == [0, 1]
    assert a.confusion == [[3, 1], [2, 4]]  # rows human 0/1, columns reward 0/1
    assert a.disagreements == [4, 5, 6]


def test_kappa_extremes():
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))  # one label on both sides: undefined


def _labels(tmp_path, rows):
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [  # format_boxed judged against "the answer is properly boxed" labels
    {"prompt": "q", "response": "\\boxed{1}", "label": True},
    {"prompt": "q", "response": "\\boxed{2}", "label": True},
    {"prompt": "q", "response": "\\boxed{3", "label": True},  # the reward says no: disagreement
    {"prompt": "q", "response": "3", "label": False},
    {"prompt": "q", "response": "\\boxed{4}", "label": False},  # the reward says yes: disagreement
    {"prompt": "q", "response": "4", "label": False},
]


def test_reward_check_reports_hand_computed_kappa(tmp_path, capsys):
    path = _labels(tmp_path, ROWS)
    assert main(["reward-check", path, "--reward", "format_boxed", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # p_o = 4/6; human 3 yes/3 no, reward 3 yes/3 no -> p_e = 0.5; kappa = (2/3 - 1/2) / (1/2) = 1/3
    assert report["accuracy"] == pytest.approx(4 / 6)
    assert report["kappa"] == pytest.approx(1 / 3)
    assert report["confusion"] == [[2, 1], [1, 2]]
    assert [d["record"] for d in report["disagreements"]] == [3, 5]


def test_min_kappa_gates(tmp_path, capsys):
    path = _labels(tmp_path, ROWS)
    assert main(["reward-check", path, "--reward", "format_boxed", "--min-kappa", "0.3"]) == 0
    assert main(["reward-check", path, "--reward", "format_boxed", "--min-kappa", "0.5"]) == 1
    assert "below --min-kappa" in capsys.readouterr().err


def test_reward_check_math_on_shipped_labels(capsys):
    assert main(["reward-check", str(DATA / "math_labels.jsonl"), "--reward", "math", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == report["verified"] == 40
    assert report["kappa"] > 0.8
    # the known disagreement: a spelled-out number math-verify cannot read
    assert any(d["response"] == "Fifty-six." for d in report["disagreements"])


def test_bad_inputs_exit_2_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "q", "response": "r", "label": true}\n{not json\n')
    assert main(["reward-check", str(path), "--reward", "format_boxed"]) == 2
    assert f"{path}:2" in capsys.readouterr().err
    path.write_text('{"prompt": "q", "response": "r"}\n')
    assert main(["reward-check", str(path), "--reward", "format_boxed"]) == 2
    assert "missing field 'label'" in capsys.readouterr().err
    good = _labels(tmp_path, ROWS)
    assert main(["reward-check", good, "--reward", "no_such_term"]) == 2
    assert "no_such_term" in capsys.readouterr().err


def test_verify_command_prints_statuses(tmp_path, capsys):
    path = tmp_path / "pairs.jsonl"
    rows = [{"gold": "\\frac{1}{2}", "answer": "\\boxed{0.5}"}, {"gold": "2", "answer": "\\boxed{3}"},
            {"gold": 5, "answer": "\\boxed{9^{9^{9^9}}}"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["verify", "--verifier", "math", "--timeout-s", "2", str(path)]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(o["line"], o["correct"], o["status"]) for o in out] == [
        (1, True, "ok"), (2, False, "ok"), (3, None, "timeout")]


def test_verify_command_rejects_malformed_line(tmp_path, capsys):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"gold": "1", "answer": "1"}\n\n{"gold": "1"}\n')
    assert main(["verify", str(path)]) == 2
    assert f"{path}:3: missing field 'answer'" in capsys.readouterr().err
