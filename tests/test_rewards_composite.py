"""Composite rewards from recipe weights, and the format/shaping terms."""

from __future__ import annotations

import pytest

from postrl.config.loading import load_config
from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards.composite import apply_terms
from postrl.rewards.format import boxed_answer, follows_think_answer, tagged_answer
from postrl.rewards.terms import TERMS, register_term

RECIPE = """
domains:
  code:
    weight: 1.0
    reward: {compiles: 0.2, tests: 0.8, penalty_timeout: -1.0}
"""


def _code_scores():
    # what a code domain's verifier returns: its own terms in components
    return [
        Score(1.0, True, "ok", {"compiles": 1.0, "tests": 1.0, "penalty_timeout": 0.0}),
        Score(0.0, False, "ok", {"compiles": 1.0, "tests": 0.5, "penalty_timeout": 0.0}),
        Score(0.0, False, "ok", {"compiles": 0.0, "tests": 0.0, "penalty_timeout": 1.0}),
    ]


def _batch(n):
    return [Task("code", f"t{i}", "p", "a") for i in range(n)], [Response("x", "stop")] * n


def test_weights_from_yaml_compute_the_formula(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    weights = load_config(str(recipe)).domains["code"].reward
    tasks, responses = _batch(3)
    out = apply_terms(weights, tasks, responses, _code_scores())
    # 0.2*compiles + 0.8*tests - penalty, by hand
    assert [s.reward for s in out] == pytest.approx([1.0, 0.2 + 0.4, -1.0], abs=1e-12)
    assert out[1].components == {"compiles": 1.0, "tests": 0.5, "penalty_timeout": 0.0}
    assert [s.correct for s in out] == [True, False, False]


def test_shaping_terms_and_own_reward_are_logged_separately():
    tasks = [Task("gsm", "t", "q", "4")] * 3
    responses = [Response("so \\boxed{4}", "stop"), Response("four", "stop"), Response("\\boxed{4", "length")]
    scores = [Score(1.0, True, "ok", {"correct": 1.0}), Score(0.0, False, "ok", {"correct": 0.0}),
              Score(0.0, False, "ok", {"correct": 0.0})]
    timings = {}
    out = apply_terms({"reward": 1.0, "format_boxed": 0.1, "overlong": -0.5}, tasks, responses, scores,
                      timings=timings)
    assert [s.reward for s in out] == pytest.approx([1.1, 0.0, -0.5], abs=1e-12)
    assert out[0].components == {"correct": 1.0, "reward": 1.0, "format_boxed": 1.0, "overlong": 0.0}
    assert out[2].components["overlong"] == 1.0 and out[2].components["format_boxed"] == 0.0
    assert set(timings) == {"reward_reward_s", "reward_format_boxed_s", "reward_overlong_s"}


def test_empty_weights_keep_the_domains_reward():
    tasks, responses = _batch(3)
    scores = _code_scores()
    assert apply_terms({}, tasks, responses, scores) == scores


def test_unknown_term_names_it_and_the_valid_ones():
    tasks, responses = _batch(3)
    with pytest.raises(UserError) as e:
        apply_terms({"tests": 1.0, "compile": 0.2}, tasks, responses, _code_scores())
    msg = str(e.value)
    assert "'compile'" in msg and "compiles" in msg and "format_boxed" in msg and "tests" in msg.split("valid")[1]


def test_declared_components_allow_a_term_absent_from_this_batch():
    tasks, responses = _batch(1)
    scores = [Score(1.0, True, "ok", {"tests": 1.0})]
    out = apply_terms({"tests": 1.0, "penalty_oom": -1.0}, tasks, responses, scores,
                      components={"tests", "penalty_oom"})
    assert out[0].reward == 1.0 and out[0].components["penalty_oom"] == 0.0
    with pytest.raises(UserError, match="penalty_oom"):
        apply_terms({"tests": 1.0, "penalty_oom": -1.0}, tasks, responses, scores)


def test_verifier_status_survives_composition():
    tasks, responses = _batch(2)
    responses = [Response("\\boxed{1}", "stop")] * 2
    scores = [Score(0.0, None, "timeout", {}, "killed"), Score(1.0, True, "ok", {"tests": 1.0})]
    out = apply_terms({"tests": 1.0, "format_boxed": 0.5}, tasks, responses, scores)
    assert (out[0].status, out[0].correct, out[0].detail) == ("timeout", None, "killed")
    assert out[0].reward == 0.5  # shaping still counted, but the sample stays marked unverified


def test_a_term_that_cannot_verify_marks_the_sample():
    @register_term("flaky_test_term")
    def flaky(tasks, responses):
        return [Score(0.0, None, "timeout", {}, "deadline"), 1.0]

    try:
        tasks, responses = _batch(2)
        scores = [Score(1.0, True, "ok", {}), Score(1.0, True, "ok", {})]
        out = apply_terms({"reward": 1.0, "flaky_test_term": 1.0}, tasks, responses, scores)
        assert [s.status for s in out] == ["timeout", "ok"]
        assert "flaky_test_term: timeout deadline" in out[0].detail
        assert [s.reward for s in out] == [1.0, 2.0]
    finally:
        TERMS.remove("flaky_test_term")


def test_math_term_uses_the_math_verifier():
    tasks = [Task("gsm", "t1", "q", "\\frac{1}{2}"), Task("gsm", "t2", "q", "3")]
    responses = [Response("\\boxed{0.5}", "stop"), Response("\\boxed{4}", "stop")]
    scores = [Score(0.0, None, "ok", {}), Score(0.0, None, "ok", {})]
    out = apply_terms({"math": 1.0, "format_boxed": 0.1}, tasks, responses, scores)
    assert [s.reward for s in out] == pytest.approx([1.1, 0.1])
    assert [s.components["math"] for s in out] == [1.0, 0.0]


def test_builtin_terms_registered():
    assert {"format_boxed", "format_answer_tag", "format_think_answer", "overlong", "math"} <= set(TERMS.names())


def test_the_own_reward_name_is_reserved():
    with pytest.raises(ValueError, match="reserved"):
        register_term("reward")


@pytest.mark.parametrize(
    "text, boxed",
    [("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("a \\boxed{1} then \\boxed{2}", "2"),
     ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"), ("\\boxed{3", None), ("no box", None), ("\\fbox{7}", "7")],
)
def test_boxed_answer(text, boxed):
    assert boxed_answer(text) == boxed


def test_answer_tags():
    assert tagged_answer("<answer>1</answer> x <answer> 2 </answer>") == "2"
    assert tagged_answer("<answer>1") is None
    assert follows_think_answer("<think>a</think>\n<answer>b</answer>")
    assert not follows_think_answer("hi <think>a</think><answer>b</answer>")
    assert not follows_think_answer("<think>a</think><answer></answer>")
    assert not follows_think_answer("<think>a</think><answer>b</answer><answer>c</answer>")
    tasks, _ = _batch(3)
    responses = [Response("<answer>5</answer>", "stop"), Response("<answer>5</answer><answer>6</answer>", "stop"),
                 Response("<answer> </answer>", "stop")]
    out = apply_terms({"format_answer_tag": 1.0}, tasks, responses, [Score(0.0, None)] * 3)
    assert [s.reward for s in out] == [1.0, 0.0, 0.0]


def test_length_term_is_characters_over_ten_capped_at_one():
    from postrl.records import Response
    values = TERMS.get("length")([None] * 3, [Response("", "stop"), Response("12345", "stop"), Response("x" * 40, "length")])
    assert list(values) == [0.0, 0.5, 1.0]
