"""Verifiers on hand-made cases: math written differently, numbers, letters, patterns, code in the
sandbox (fenced replies, a reply that exits before the tests), user rewards that hang, raise or
return garbage, and a reward model."""

from __future__ import annotations

import doctest
import time
from pathlib import Path

import pytest

import postrl.rewards.verifiers as verifiers_module
from postrl.errors import ConfigError, UserError
from postrl.records import Response, Task
from postrl.rewards.code_verifier import infer_entry_point, read_tests
from postrl.rewards.verifiers import VerifierSettings, check_verifier, make_verifier
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable
from postrl.tasks import dataset  # noqa: F401  (registers every verifier, as a run has them)

TESTS_DIR = str(Path(__file__).resolve().parent)


def grade(spec: str, golds: list[str], replies: list[str], **settings):
    return make_verifier(spec, VerifierSettings(**settings)).grade(golds, replies)


def test_the_docstring_examples_hold():
    assert doctest.testmod(verifiers_module).failed == 0


def test_math_equal_answers_written_differently():
    golds = ["1/2", "0.5", "\\frac{1}{2}", "1/2", "\\frac{1}{2}"]
    replies = ["so \\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "it is \\boxed{1/2}", "\\boxed{0.4}", "no box: 1/2"]
    scores = grade("math", golds, replies, extract="boxed")
    assert [s.correct for s in scores] == [True, True, True, False, False]
    assert [s.extracted for s in scores] == ["0.5", "\\frac{1}{2}", "1/2", "0.4", None]
    assert all(s.status == "ok" for s in scores)
    # two different boxed answers are no answer (a hedge over candidates: the hack library's
    # several_answers); the same one twice is that answer; nested braces are kept whole
    scores = grade("math", ["4", "4", "\\frac{1}{2}"],
                   ["\\boxed{3} no, \\boxed{4}", "\\boxed{4}, so \\boxed{4}", "\\boxed{\\frac{\\sqrt{4}}{4}}"],
                   extract="boxed")
    assert [s.correct for s in scores] == [False, True, True]
    assert scores[0].detail == "no answer in the requested form"
    # without an extractor (the default), math-verify finds the answer itself
    assert [s.correct for s in grade("math", ["\\frac{1}{2}", "7"], ["\\boxed{\\frac{2}{4}}", "so 7"])] == [True, True]


def test_exact_numeric_choice_regex():
    assert [s.correct for s in grade("exact", ["Paris", "Paris"], ["Paris", "paris"])] == [True, False]
    scores = grade("numeric", ["72", "0.5", "1,200", "3"], ["#### 72", "x = 1/2", "1200.0", "3.01"], tolerance=1e-6)
    assert [s.correct for s in scores] == [True, True, True, False]
    assert grade("numeric", ["3"], ["3.01"], tolerance=0.01)[0].correct is True
    assert [s.correct for s in grade("numeric", ["2"], ["two"])] == [False]  # no number: wrong
    unreadable = grade("numeric", ["n/a"], ["2"])[0]
    assert unreadable.correct is None and unreadable.status == "error" and "not a number" in unreadable.detail
    scores = grade("choice", ["B", "(C)", "A", "D"], ["(B)", "I think the answer is C.", "B", "no idea"])
    assert [s.correct for s in scores] == [True, True, False, False]
    assert [s.extracted for s in scores] == ["B", "C", "B", None]
    assert grade("choice", ["maybe"], ["A"])[0].status == "error"
    assert [s.correct for s in grade("regex", [r"\d+ apples", r"\d+"], ["12 apples", "12 apples"])] == [True, False]
    assert grade("regex", ["(unclosed"], ["x"])[0].status == "error"


def test_a_bad_verifier_name_is_a_config_error():
    for spec, message in [("bogus", "unknown verifier"), ("exact:x", "takes no argument"),
                          ("python:nomodule_xyz:f", "cannot load"), ("python:os", "MODULE:FUNCTION"),
                          ("rm:/nonexistent", "no reward model")]:
        with pytest.raises(ConfigError, match=message):
            check_verifier(spec, "domains.d.params.verifier")


# ---------------------------------------------------------------------------- code


@pytest.fixture(scope="module")
def sandbox():
    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))


def code_tasks(style: str, tests, entry_point: str = "") -> Task:
    test = read_tests(style, tests)
    entry = entry_point or ("" if style == "io" else infer_entry_point(test))
    return Task("mbpp", "t", "Write add.", "", meta={"tests": test, "entry_point": entry})


def code_scores(style: str, tests, replies: list[str], entry_point: str = ""):
    v = make_verifier("code", VerifierSettings(tests_style=style, workers=2, timeout_s=5))
    try:
        task = code_tasks(style, tests, entry_point)
        return v.score([task] * len(replies), [Response(r, "stop") for r in replies])
    finally:
        v.close()


ADD = "def add(a, b):\n    return a + b\n"


def test_code_assert_style_grades_the_extracted_code(sandbox):
    replies = [
        f"Here you go:\n```python\n{ADD}```\nIt adds.",                     # fenced chat reply
        f"```python\ndef add(a, b):\n    return a - b\n```\nBetter:\n```python\n{ADD}```",  # two blocks: the last
        f"```python\n{ADD}```\nor\n```python\ndef add(a, b):\n    return 0\n```",          # the last is wrong
        ADD,                                                                 # no fence: the whole reply
        f"```python\nimport sys\n{ADD}sys.exit(0)\n```",                     # exits before the tests
        "```python\ndef add(a, b) return\n```",                              # does not compile
    ]
    scores = code_scores("assert", ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], replies)
    assert [s.correct for s in scores] == [True, True, False, True, False, False]
    assert [s.components["compiles"] for s in scores] == [1, 1, 1, 1, 1, 0]
    assert scores[0].reward == pytest.approx(1.0) and scores[0].extracted == ADD
    assert scores[4].reward == pytest.approx(0.2) and scores[4].status == "ok"


def test_code_check_and_io_styles(sandbox):
    check = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n"
    scores = code_scores("check", check, [f"```python\n{ADD}```", "def add(a, b):\n    return 5"], entry_point="add")
    assert [s.correct for s in scores] == [True, False]
    cases = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}]
    replies = ["```python\na, b = map(int, input().split())\nprint(a + b)\n```",
               "a, b = map(int, input().split())\nprint(a * b)",
               "import sys\nsys.exit(0)"]
    scores = code_scores("io", cases, replies)
    assert [s.correct for s in scores] == [True, False, False]
    assert scores[0].components["tests_frac"] == 1.0 and scores[1].components["tests_frac"] == 0.0
    assert code_scores("io", {"inputs": ["4\n"], "outputs": ["16\n"]}, ["print(int(input()) ** 2)"])[0].correct


def test_code_tests_are_read_strictly():
    for style, value in [("assert", []), ("assert", ["assert add(1,"]), ("check", "assert 1"),
                         ("io", [{"input": 1, "output": "2"}]), ("io", {"inputs": ["1"], "outputs": []})]:
        with pytest.raises(ValueError):
            read_tests(style, value)
    with pytest.raises(ValueError, match="entry_point"):
        infer_entry_point(read_tests("assert", ["assert len([1]) == 1"]))
    with pytest.raises(UserError, match="tests_style"):
        make_verifier("code", VerifierSettings(tests_style="pytest"))


# ---------------------------------------------------------------------------- user rewards


def user_scores(function: str, replies: list[str], tasks: list[Task] | None = None, timeout_s: float = 5.0):
    v = make_verifier(f"python:user_rewards:{function}",
                      VerifierSettings(base_dir=TESTS_DIR, timeout_s=timeout_s, workers=2))
    tasks = tasks or [Task("qa", f"t{i}", "q?", "42", meta={"row": {"q": "q?", "answer": "42"}})
                      for i in range(len(replies))]
    try:
        return v.score(tasks, [Response(r, "stop") for r in replies])
    finally:
        v.close()


def test_a_user_reward_gets_the_columns_and_its_values():
    scores = user_scores("match", ["42", "41"])
    assert [(s.reward, s.correct, s.status) for s in scores] == [(1.0, True, "ok"), (0.0, False, "ok")]
    assert scores[0].components == {"user": 1.0}


def test_a_chat_domain_passes_messages_as_trl_does():
    msgs = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "q?"})
    task = Task("qa", "t", "q?", "42", meta={"row": {"q": "q?"}, "conversational": True}, messages=msgs)
    assert [s.reward for s in user_scores("chat_shape", ["42", "x"], [task, task])] == [1.0, 1.0]


def test_a_user_reward_that_hangs_or_raises_gives_statuses_not_a_dead_run():
    t0 = time.monotonic()
    tasks = [Task("qa", "a", "q", "1", meta={"row": {}}), Task("qa", "b", "q", "1", meta={"row": {}})]
    scores = user_scores("hang", ["hang", "fine"], tasks, timeout_s=1.0)
    assert [(s.status, s.correct) for s in scores] == [("timeout", None), ("ok", False)]
    assert scores[1].reward == 0.5 and time.monotonic() - t0 < 30
    scores = user_scores("boom", ["a", "b"])
    assert all(s.status == "error" and s.correct is None and "user reward failed" in s.detail for s in scores)


def test_a_user_reward_returning_garbage_is_an_error_per_sample():
    tasks = [Task("qa", "same", "q", "1", meta={"row": {}})] * 3
    scores = user_scores("garbage", ["word", "other", "x"], tasks)
    assert [s.status for s in scores] == ["error", "not_applicable", "not_applicable"]  # None: TRL's "does not apply"
    assert "'high' is not a number" in scores[0].detail and "does not apply (None)" in scores[1].detail
    scores = user_scores("garbage", ["short", "x"], [tasks[0], tasks[0]])
    assert all("returned 1 values for 2 completions" in s.detail for s in scores)


def test_a_user_reward_is_called_as_trl_calls_it_and_its_logs_come_back_from_the_worker():
    tasks = [Task("qa", "same", "q", "42", meta={"row": {"answer": "42"}})] * 3
    scores = user_scores("trl_logged", ["42", "41", ""], tasks)
    assert [(s.reward, s.status) for s in scores] == [(1.0, "ok"), (0.0, "ok"), (0.0, "not_applicable")]
    assert [s.logged for s in scores] == [{"reply": "42"}, {"reply": "41"}, {"reply": ""}]
    assert scores[0].metrics == {"reward_fn/trl_logged": 1.0, "reward_fn/trl_logged/calls": 1.0}
    assert scores[2].metrics == {"reward_fn/trl_logged/calls": 1.0}


def test_a_reward_model_verifier_scores_in_0_1(tmp_path):
    from postrl.rewards.models.rm import RewardModel

    RewardModel.create("abc\n", seed=0, hidden=16, layers=1).save(tmp_path / "rm")
    v = make_verifier("rm:rm", VerifierSettings(base_dir=str(tmp_path)))
    scores = v.score([Task("s", "t", "cab", "")] * 2, [Response("abc", "stop"), Response("<think>c</think>cba", "stop")])
    assert all(0 < s.reward < 1 and s.correct is None and s.status == "ok" for s in scores)
    assert scores[1].extracted == "cba"
