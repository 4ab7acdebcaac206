"""The arith domain: generation, held-out split, worked solutions, and the strict verifier."""

import random

import pytest

from postrl.errors import UserError
from postrl.records import Response
from postrl.tasks.arith import extract_answer, score_answer, solve, systematic_mistake
from postrl.tasks.catalog import make_domain


@pytest.mark.parametrize(
    "nums,ops,right,mistake",
    [
        ([47, 38], ["+"], ("[1]", 85), ("[0]", 75)),  # a needed carry forgotten
        ([12, 13], ["+"], ("[0]", 25), ("[0]", 25)),  # no carry needed: the mistake is harmless
        ([52, 38], ["-"], ("[1]", 14), ("[0]", 24)),  # a needed borrow forgotten
        ([952, 38], ["+"], ("[01]", 990), ("[00]", 980)),
        ([52, 38, 17], ["-", "+"], ("[1,1]", 31), ("[0,0]", 31)),  # wrong work, right value
    ],
)
def test_worked_solutions_by_hand(nums, ops, right, mistake):
    assert solve(nums, ops) == right
    assert solve(nums, ops, drop=True) == mistake
    assert systematic_mistake(nums, ops) == mistake[1]


def test_heldout_is_fixed_and_never_sampled_for_training():
    d = make_domain("arith", {"levels": [2, 3]})
    held = d.heldout(100)
    assert [t.prompt for t in held] == [t.prompt for t in make_domain("arith", {"levels": [2, 3]}, seed=7).heldout(100)]
    assert len({t.prompt for t in held}) == 100 and {t.level for t in held} == {2, 3}
    rng = random.Random(0)
    training = {d.sample(rng).prompt for _ in range(5000)}
    assert not training & {t.prompt for t in held}


def test_answers_are_right():
    d = make_domain("arith", {"levels": [1, 2, 3, 4, 5]})
    rng = random.Random(1)
    for _ in range(200):
        t = d.sample(rng)
        assert int(t.answer) == eval(t.prompt.rstrip("="))  # left-to-right +/- equals Python's
        assert int(t.answer) >= 0


@pytest.mark.parametrize(
    "text,finish,correct",
    [
        ("[1]85", "stop", True),
        ("85", "stop", True),  # the worked part is optional
        (" [1]85 ", "stop", True),
        ("[0]85", "stop", True),  # only the outcome is graded
        ("[1]85", "length", False),  # truncated: not cleanly terminated
        ("[1]75", "stop", False),
        ("[1]85,", "stop", False),
        ("85 or 86", "stop", False),
        ("[1]8 5", "stop", False),
        ("", "stop", False),
    ],
)
def test_strict_verifier(text, finish, correct):
    score = score_answer("85", Response(text, finish))
    assert score.correct is correct and score.reward == float(correct) and score.status == "ok"


def test_extractor_rejects_partial_answers():
    assert extract_answer("[1]") is None and extract_answer("x85") is None and extract_answer("[0,1]-3") == -3


def test_bad_level_is_a_user_error():
    with pytest.raises(UserError, match="levels are"):
        make_domain("arith", {"levels": [0]})


def test_require_carry_keeps_only_problems_the_mistake_changes():
    d = make_domain("arith", {"levels": [2], "require_carry": True})
    rng = random.Random(0)
    tasks = [d.sample(rng) for _ in range(200)] + d.heldout(50)
    for t in tasks:
        nums_ops = t.prompt.rstrip("=")
        assert "1" in solve(*_parse(nums_ops))[0]


def _parse(expr):
    import re

    parts = re.split(r"([+-])", expr)
    return [int(p) for p in parts[::2]], parts[1::2]
