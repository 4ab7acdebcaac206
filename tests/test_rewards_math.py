"""Math verification: equivalences, pathological answers, threads, cache, statuses."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from postrl.records import Response, Task
from postrl.rewards.math import MathVerifier

EQUIVALENT = [
    ("\\frac{1}{2}", "so the answer is \\boxed{0.5}"),  # fraction vs decimal
    ("0.5", "\\boxed{\\frac{1}{2}}"),  # decimal vs fraction
    ("\\frac{3}{4}", "The answer is $\\frac{6}{8}$."),  # unreduced fraction, no box
    ("12", "0.15 * 80 = 12, so \\boxed{12}"),  # boxed integer after reasoning
    ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}"),  # sets ignore order
    ("[1, 3)", "\\boxed{[1,3)}"),  # half-open interval
    ("(-2, 2)", "x lies in $(-2,2)$"),  # open interval
    ("50\\%", "\\boxed{0.5}"),  # percent vs decimal
    ("25\\%", "\\boxed{25\\%}"),  # percent vs percent
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),  # symbolic equality
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("1024", "\\boxed{2^{10}}"),
]
DIFFERENT = [
    ("\\frac{1}{2}", "\\boxed{0.6}"),
    ("[1, 3)", "\\boxed{(1,3)}"),  # open vs half-open
    ("\\{1, 2\\}", "\\boxed{\\{1, 3\\}}"),
    ("50\\%", "\\boxed{0.6}"),
    ("-7", "\\boxed{7}"),
    ("56", "I am not sure."),  # nothing extractable: wrong, not unverifiable
]
PATHOLOGICAL = ["\\boxed{9^{9^{9^9}}}", "\\boxed{(10^{100})!}", "\\boxed{2^{2^{2^{2^{2^{2}}}}}}"]


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=2, timeout_s=2.0, cache_size=0) as v:
        yield v


def test_equivalent_answers_are_correct(verifier):
    scores = verifier.verify(EQUIVALENT)
    assert [(s.status, s.correct, s.reward) for s in scores] == [("ok", True, 1.0)] * len(EQUIVALENT)
    assert all(s.components == {"correct": 1.0} for s in scores)


def test_different_answers_are_wrong_not_unverified(verifier):
    scores = verifier.verify(DIFFERENT)
    assert [(s.status, s.correct, s.reward) for s in scores] == [("ok", False, 0.0)] * len(DIFFERENT)


def test_pathological_answers_time_out_and_the_verifier_stays_usable(verifier):
    scores = verifier.verify([("5", a) for a in PATHOLOGICAL])
    assert [(s.status, s.correct, s.reward) for s in scores] == [("timeout", None, 0.0)] * len(PATHOLOGICAL)
    assert verifier.verify([("3", "\\boxed{3}")])[0].correct is True


def test_pathological_answer_does_not_block_the_calling_process(verifier):
    done = threading.Event()
    thread = threading.Thread(target=lambda: (verifier.verify([("5", PATHOLOGICAL[0])]), done.set()))
    thread.start()
    # while a worker grinds on the hang, this thread keeps running and the call comes back
    assert sum(range(10_000)) == 49_995_000
    thread.join(timeout=60)
    assert done.is_set()


def test_unparseable_gold_is_an_error_not_a_verdict(verifier):
    score = verifier.verify([("", "\\boxed{1}")])[0]
    assert (score.status, score.correct) == ("error", None)
    assert "gold" in score.detail


def test_thread_and_thread_pool_match_main_thread(verifier):
    pairs = EQUIVALENT + DIFFERENT
    main = [s.correct for s in verifier.verify(pairs)]
    from_thread = []
    t = threading.Thread(target=lambda: from_thread.extend(s.correct for s in verifier.verify(pairs)))
    t.start()
    t.join()
    with ThreadPoolExecutor(4) as ex:
        pooled = [s.correct for s in ex.map(lambda p: verifier.verify([p])[0], pairs)]
    assert main == from_thread == pooled
    assert main == [True] * len(EQUIVALENT) + [False] * len(DIFFERENT)


def test_plain_math_verify_cannot_run_in_a_thread():
    # the reason the pool exists: math-verify's SIGALRM timeout raises outside the main thread
    from math_verify import parse, verify

    errors = []

    def work():
        try:
            verify(parse("$1$"), parse("$1$"))
        except ValueError as e:
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert errors and "thread" in str(errors[0])


def test_cache_and_batch_dedupe():
    with MathVerifier(workers=1, timeout_s=5.0) as v:
        v.verify([("2", "\\boxed{2}"), ("2", "\\boxed{2}"), ("2", "\\boxed{3}")])
        assert v.stats["calls"] == 2  # the duplicate pair went to a worker once
        again = v.verify([("2", "\\boxed{2}"), ("2", "\\boxed{3}")])
        assert v.stats["calls"] == 2 and v.stats["cache_hits"] == 2
        assert [s.correct for s in again] == [True, False]
        again[0].components["x"] = 1.0  # callers may extend what they get back...
        assert v.verify([("2", "\\boxed{2}")])[0].components == {"correct": 1.0}  # ...not the cache


def test_timeouts_are_not_cached():
    with MathVerifier(workers=1, timeout_s=1.0) as v:
        for _ in range(2):
            assert v.verify([("5", PATHOLOGICAL[0])])[0].status == "timeout"
        assert v.stats["calls"] == 2 and v.stats["cache_hits"] == 0


def test_domain_style_score_uses_task_answer(verifier):
    tasks = [Task("gsm", "t1", "q", "\\frac{1}{2}"), Task("gsm", "t2", "q", "7")]
    responses = [Response("\\boxed{0.5}", "stop"), Response("\\boxed{8}", "stop")]
    assert [s.correct for s in verifier.score(tasks, responses)] == [True, False]


def test_workers_remember_many_more_parsed_answers_than_math_verify():
    import subprocess
    import sys

    code = ("from postrl.rewards.math import warmup; warmup(4096); import math_verify.parser as p; "
            "print(p.parse_latex_cached.cache_info().maxsize, p.parse_expr_cached.cache_info().maxsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["4096", "4096"]


def test_many_completions_sharing_few_answers_keep_their_verdicts(verifier):
    # 60 distinct completions, 3 answers: the widened parse cache serves most of them
    pairs = [("\\frac{3}{4}", f"Step {i}: we get \\boxed{{{ans}}}") for i in range(20)
             for ans in ("0.75", "\\frac{6}{8}", "\\frac{4}{3}")]
    assert [s.correct for s in verifier.verify(pairs)] == [True, True, False] * 20


def test_verifier_asks_its_workers_for_the_parse_cache():
    v = MathVerifier(workers=1, parse_cache=123)
    assert v._pool._spec.options == {"parse_cache": 123}
    v.close()
