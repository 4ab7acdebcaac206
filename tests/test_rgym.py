"""reasoning-gym domains: registry, levels, held-out split, strict scoring, isolation."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from postrl.errors import UserError
from postrl.records import Response
from postrl.tasks.catalog import available_domains, make_domain
from postrl.tasks.rgym import EVAL_SCORED, RG_DATASETS


def test_every_reasoning_gym_dataset_is_a_domain():
    import reasoning_gym  # noqa: F401
    from reasoning_gym.factory import DATASETS

    assert sorted(RG_DATASETS) == sorted(DATASETS)
    assert {f"rg:{n}" for n in DATASETS} <= set(available_domains())


@pytest.mark.parametrize("name", ["basic_arithmetic", "gsm_symbolic", "simple_equations", "knights_knaves",
                                  "shortest_path", "mini_sudoku"])
def test_popular_domains_sample_and_accept_their_gold_answer(name):
    d = make_domain(f"rg:{name}", {"heldout_size": 4}, seed=0)
    rng = random.Random(0)
    tasks = [d.sample(rng) for _ in range(3)]
    assert all(t.domain == f"rg:{name}" and t.level in d.levels for t in tasks)
    scores = d.score(tasks, [Response(t.answer, "stop") for t in tasks])
    assert [(s.status, s.correct, s.reward) for s in scores] == [("ok", True, 1.0)] * 3
    wrong = d.score(tasks[:1], [Response("certainly not the answer", "stop")])[0]
    assert (wrong.status, wrong.correct, wrong.reward) == ("ok", False, 0.0)


def test_levels_are_exposed_and_respected():
    d = make_domain("rg:basic_arithmetic", {"heldout_size": 4}, seed=0)
    assert d.levels == [0, 1, 2, 3, 4]
    rng = random.Random(1)
    assert {d.sample(rng, level=3).level for _ in range(5)} == {3}
    # higher levels allow longer expressions
    short = max(len(d.sample(rng, level=0).prompt) for _ in range(30))
    long_ = max(len(d.sample(rng, level=4).prompt) for _ in range(30))
    assert long_ > short
    sub = make_domain("rg:basic_arithmetic", {"levels": [1, 2], "heldout_size": 4}, seed=0)
    assert sub.levels == [1, 2]


def test_heldout_is_fixed_distinct_and_never_sampled_for_training():
    # level 0 of chain_sum has a small problem space, so collisions would happen without the dedupe
    params = {"levels": [0], "heldout_size": 50, "config": {"min_terms": 2, "max_terms": 2,
                                                            "min_digits": 1, "max_digits": 1}}
    d = make_domain("rg:chain_sum", params, seed=0)
    held = d.heldout(50)
    assert held == d.heldout(50) == make_domain("rg:chain_sum", params, seed=0).heldout(50)
    held_prompts = {t.prompt for t in held}
    assert len(held_prompts) == 50
    rng = random.Random(0)
    train_prompts = {d.sample(rng).prompt for _ in range(300)}
    assert not train_prompts & held_prompts


def test_partial_credit_is_off_by_default():
    strict = make_domain("rg:basic_arithmetic", {"heldout_size": 4}, seed=0)
    task = strict.sample(random.Random(0))
    near_miss = Response("-" + task.answer, "stop")  # reasoning-gym gives this partial credit
    s = strict.score([task], [near_miss])[0]
    assert 0.0 < s.components["rg_score"] < 1.0
    assert (s.reward, s.correct) == (0.0, False)
    lenient = make_domain("rg:basic_arithmetic", {"heldout_size": 4, "partial_credit": True}, seed=0)
    p = lenient.score([task], [near_miss])[0]
    assert p.reward == s.components["rg_score"] and p.correct is False


def test_answer_extraction_modes():
    d = make_domain("rg:basic_arithmetic", {"heldout_size": 4}, seed=0)
    task = d.sample(random.Random(0))
    tagged = Response(f"<think>work</think><answer>{task.answer}</answer>", "stop")
    assert d.score([task], [tagged])[0].correct is True
    raw = make_domain("rg:basic_arithmetic", {"heldout_size": 4, "answer": "raw"}, seed=0)
    assert raw.score([task], [tagged])[0].correct is False


def test_eval_scored_dataset_cannot_write_files(tmp_path):
    target = tmp_path / "pwned.txt"
    attack = f"__import__('pathlib').Path({str(target)!r}).write_text('x') and ['A']"
    d = make_domain("rg:string_insertion", {"heldout_size": 4}, seed=0)
    assert d.isolate
    task = d.sample(random.Random(0))
    score = d.score([task], [Response(attack, "stop")])[0]
    assert (score.status, score.reward) == ("ok", 0.0)
    assert not target.exists()
    # control: reasoning-gym's own scorer, run unconfined (in a throwaway process), does write it
    code = (
        "import reasoning_gym as rg, sys\n"
        "ds = rg.create_dataset('string_insertion', size=1, seed=0)\n"
        "ds.score_answer(sys.argv[1], ds[0])\n"
    )
    subprocess.run([sys.executable, "-c", code, attack], check=True, timeout=120)
    assert target.exists()


def test_eval_scored_datasets_are_isolated_and_time_bounded():
    assert "countdown" in EVAL_SCORED and len(EVAL_SCORED) == 9
    with pytest.raises(UserError, match="isolate"):
        make_domain("rg:countdown", {"isolate": False}, seed=0)
    d = make_domain("rg:countdown", {"heldout_size": 4, "timeout_s": 2}, seed=0)
    task = d.sample(random.Random(0))
    ok, hang = d.score([task, task], [Response(task.answer, "stop"), Response("9**9**9**9**9", "stop")])
    assert (ok.status, ok.correct) == ("ok", True)
    assert (hang.status, hang.correct, hang.reward) == ("timeout", None, 0.0)


def test_bad_params_are_user_errors():
    with pytest.raises(UserError, match="unknown params"):
        make_domain("rg:basic_arithmetic", {"levles": [0]}, seed=0)
    with pytest.raises(UserError, match="levels"):
        make_domain("rg:basic_arithmetic", {"levels": [9]}, seed=0)
    with pytest.raises(UserError, match="bad config"):
        make_domain("rg:basic_arithmetic", {"config": {"no_such_field": 1}}, seed=0)
