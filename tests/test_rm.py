"""Bradley-Terry reward models: shipped preferences, from scratch and on a pretrained backbone (full and
LoRA), TRL preference formats, held-out accuracy, reuse as a term and as a domain's verifier."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from postrl.cli import main
from postrl.errors import UserError
from postrl.records import Response, Task
from postrl.rewards.composite import apply_terms
from postrl.rewards.models.preferences import Pair
from postrl.rewards.models.rm import (
    RewardModel,
    is_sorted_answer,
    load_pairs,
    make_preferences,
    pairwise_accuracy,
    register_rm_term,
    split_pairs,
    train_reward_model,
)
from postrl.rewards.terms import TERMS
from postrl.tasks.catalog import make_domain

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


# ---------------------------------------------------------------------------- pretrained backbones


def _concise_arith_pairs(n: int, seed: int = 0) -> list[Pair]:
    """The project's rule in the tiny model's alphabet: a short right answer beats the same answer
    padded long, or an evasive empty one."""
    import random

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        good = f"[0]{a + b}"
        bad = rng.choice([good + ",0,0,0,0,0", "[]", f"{good}{'0' * 6}"])
        pairs.append(Pair(f"{a}+{b}=", good, bad))
    return pairs


def test_reward_model_on_a_pretrained_backbone_beats_chance(tiny_model_dir, tmp_path):
    pairs = _concise_arith_pairs(300)
    _, held = split_pairs(pairs, 0.2)
    rm = RewardModel.from_backbone(tiny_model_dir, seed=0)
    before = pairwise_accuracy(rm, held)
    rm, report = train_reward_model(pairs, tmp_path / "rm", rm=rm, steps=30, batch_size=16, lr=1e-3)
    assert report["heldout_pairs"] == len(held) > 30
    assert report["heldout_accuracy"] >= 0.8 > before  # a fresh head is at (or below) chance
    # the decoder is the backbone's: its weights were copied, not re-initialised
    backbone = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    fresh = RewardModel.from_backbone(tiny_model_dir, seed=1)
    assert torch.equal(fresh.model.base_model.embed_tokens.weight, backbone.model.embed_tokens.weight)
    # a standard HF directory plus postrl's json, scoring as the trained model did
    saved = tmp_path / "rm"
    assert {"config.json", "model.safetensors", "postrl_rm.json", "rm_report.json"} <= {p.name for p in saved.iterdir()}
    assert AutoModelForSequenceClassification.from_pretrained(saved).config.num_labels == 1
    assert RewardModel.load(saved).score(["12+30="], ["[0]42"]) == pytest.approx(rm.score(["12+30="], ["[0]42"]), abs=1e-5)


def test_lora_reward_model_trains_only_adapters_and_head(tiny_model_dir, tmp_path):
    rm = RewardModel.from_backbone(tiny_model_dir, lora_r=4, seed=0)
    names = [n for n, p in rm.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n or "score" in n for n in names)
    assert any("score" in n for n in names)
    frozen = rm.model.base_model.embed_tokens.weight.clone()
    rm, report = train_reward_model(_concise_arith_pairs(200), tmp_path / "lora", rm=rm, steps=20, batch_size=16,
                                    lr=3e-3)
    assert torch.equal(rm.model.base_model.embed_tokens.weight, frozen)
    assert report["heldout_accuracy"] > 0.6 and report["lora_r"] == 4
    assert (tmp_path / "lora" / "adapter" / "adapter_config.json").is_file()
    loaded = RewardModel.load(tmp_path / "lora")  # adapters merged: loads without peft
    assert loaded.score(["1+2="] * 2, ["[0]3", "[]"]) == pytest.approx(rm.score(["1+2="] * 2, ["[0]3", "[]"]), abs=1e-5)


def test_scores_come_in_micro_batches_of_the_models_own_size(tiny_model_dir):
    rm = RewardModel.from_backbone(tiny_model_dir, score_batch_size=3)
    widths = []
    original = rm.logits
    rm.logits = lambda p, r: widths.append(len(p)) or original(p, r)
    one_by_one = [rm.score([f"{i}+1="], [f"[0]{i + 1}"])[0] for i in range(7)]
    widths.clear()
    batched = rm.score([f"{i}+1=" for i in range(7)], [f"[0]{i + 1}" for i in range(7)])
    assert widths == [3, 3, 1]
    assert batched == pytest.approx(one_by_one, abs=1e-5)  # right padding leaves each score unchanged
    widths.clear()
    rm.score(["1+1="] * 5, ["[0]2"] * 5, batch_size=2)
    assert widths == [2, 2, 1]


def test_trl_preference_formats(tmp_path):
    user = {"role": "user", "content": "2+2?"}
    rows = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
        {"prompt": [user], "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
        {"chosen": [user, {"role": "assistant", "content": "4"}], "rejected": [user, {"role": "assistant", "content": "5"}]},
        {"chosen": "2+2=4", "rejected": "2+2=5"},
    ]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_pairs(path)
    assert pairs[0] == Pair("2+2=", "4", "5")
    assert pairs[1] == pairs[2] == Pair((user,), ({"role": "assistant", "content": "4"},),
                                        ({"role": "assistant", "content": "5"},))
    assert pairs[3] == Pair("", "2+2=4", "2+2=5")
    path.write_text(json.dumps({"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "user",
                                                                                             "content": "b"}]}) + "\n")
    with pytest.raises(UserError, match=r"prefs.jsonl:1: no prompt"):
        load_pairs(path)


def test_chat_messages_render_through_the_chat_template_or_as_role_lines(tiny_model_dir):
    rm = RewardModel.from_backbone(tiny_model_dir)
    assert rm.render("1+1=", "[0]2") == ("1+1=[0]2", False)  # text: TRL's plain concatenation
    text, _ = rm.render(({"role": "user", "content": "1+1="},), "[0]2")
    assert text == "user: 1+1=\nassistant: [0]2\n"  # the char tokenizer has no chat template


def test_cli_trains_on_a_backbone_and_the_model_grades_a_dataset_domain(tiny_model_dir, tmp_path, capsys):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps(asdict(p)) + "\n" for p in _concise_arith_pairs(200)))
    out = tmp_path / "rm"
    assert main(["rm", "train", str(prefs), "--backbone", str(tiny_model_dir), "--out", str(out),
                 "--steps", "25", "--batch-size", "16", "--lr", "1e-3", "--score-batch-size", "4"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["heldout_accuracy"] >= 0.8 and report["backbone"] == str(tiny_model_dir)
    assert json.loads((out / "postrl_rm.json").read_text())["score_batch_size"] == 4
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"{a}+{a}="}) + "\n" for a in range(10, 30)))
    domain = make_domain("dataset", {"path": str(rows), "prompt": "{q}", "verifier": f"rm:{out}",
                                     "rm_batch_size": 2, "heldout_percent": 10}, 0, "open")
    task = domain.sample(__import__("random").Random(0))
    a = int(task.prompt[:2])
    good, bad = domain.score([task, task], [Response(f"[0]{2 * a}", "stop"), Response("[]", "stop")])
    assert good.correct is None and good.status == "ok" and 0 < bad.reward < good.reward < 1
    assert good.components == {"rm": good.reward}
