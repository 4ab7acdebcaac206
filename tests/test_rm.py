"""Bradley-Terry reward model: shipped preferences, training, held-out accuracy, reuse as a term."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from postrl.cli import main
from postrl.records import Response, Task
from postrl.rewards.composite import apply_terms
from postrl.rewards.rm import (
    RewardModel,
    is_sorted_answer,
    load_pairs,
    make_preferences,
    pairwise_accuracy,
    register_rm_term,
    split_pairs,
)
from postrl.rewards.terms import TERMS

SHIPPED = Path(__file__).resolve().parents[1] / "postrl" / "data" / "prefs_sorted.jsonl"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matrices: more threads only contend with other processes on a shared 2-core machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_shipped_preferences_are_reproducible_and_encode_the_property():
    pairs = load_pairs(SHIPPED)
    assert pairs == make_preferences(2000, seed=0)
    assert all(is_sorted_answer(p.prompt, p.chosen) and not is_sorted_answer(p.prompt, p.rejected)
               for p in pairs)
    assert SHIPPED.stat().st_size < 1_000_000


def test_split_is_by_prompt():
    train, held = split_pairs(make_preferences(500, seed=1), 0.2)
    assert held and train
    assert not {p.prompt for p in train} & {p.prompt for p in held}


def test_untrained_model_is_at_chance():
    pairs = make_preferences(200, seed=2)
    alphabet = "".join(sorted({c for p in pairs for c in p.prompt + p.chosen + p.rejected}))
    acc = pairwise_accuracy(RewardModel.create(alphabet, seed=0), pairs)
    assert 0.3 < acc < 0.7


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    assert main(["rm", "train", str(SHIPPED), "--out", str(out), "--steps", "300"]) == 0
    return out


def test_cli_trains_to_heldout_accuracy_well_above_chance(trained):
    report = json.loads((trained / "rm_report.json").read_text())
    assert report["heldout_pairs"] > 200
    assert report["heldout_accuracy"] >= 0.7
    # recomputed independently from the saved directory
    pairs = load_pairs(SHIPPED)
    _, held = split_pairs(pairs, 0.2)
    assert pairwise_accuracy(RewardModel.load(trained), held) == pytest.approx(report["heldout_accuracy"])


def test_saved_model_is_a_standard_hf_directory(trained):
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in trained.iterdir()}
    model = AutoModelForSequenceClassification.from_pretrained(trained)
    assert model.config.num_labels == 1


def test_reward_model_as_a_reward_term(trained):
    register_rm_term("rm_sorted_test", trained)
    try:
        fresh = make_preferences(100, seed=123)  # prompts never written to the shipped file
        tasks = [Task("open", f"t{i}", p.prompt, "") for i, p in enumerate(fresh)]
        good = apply_terms({"rm_sorted_test": 1.0}, tasks, [Response(p.chosen, "stop") for p in fresh],
                           [_blank() for _ in fresh])
        bad = apply_terms({"rm_sorted_test": 1.0}, tasks, [Response(p.rejected, "stop") for p in fresh],
                          [_blank() for _ in fresh])
        assert all(0.0 < s.reward < 1.0 for s in good + bad)
        wins = sum(g.reward > b.reward for g, b in zip(good, bad)) / len(fresh)
        assert wins >= 0.7
    finally:
        TERMS.remove("rm_sorted_test")


def test_rm_train_rejects_bad_pairs(tmp_path, capsys):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(asdict(make_preferences(1)[0])) + "\n" + '{"prompt": "p", "chosen": 1, '
                    '"rejected": "r"}\n')
    assert main(["rm", "train", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"{path}:2: field 'chosen' has the wrong type" in capsys.readouterr().err


def _blank():
    from postrl.records import Score

    return Score(0.0, None)
