"""The `code` verifier: the Python extracted from a reply, run against a task's tests in the sandbox.

The code graded is the code extracted from the reply (`code_fence` by default: the last fenced
block, or the whole reply when it has no fence), never prompt + reply, so an instruct model's
fenced answer is graded as the program it is. Three test styles (`tests_style`):

    assert   a list of assert lines, MBPP style:  ["assert add(1, 2) == 3", ...]
             (other lines, such as `import math`, run in order with them); the function under
             test is `entry_point`, else the first non-builtin function the asserts call
    check    a test defining check(candidate), HumanEval style, called with `entry_point`
    io       stdin/stdout cases, APPS/CodeContests style: [{"input": "1 2\\n", "output": "3\\n"}]
             or {"inputs": [...], "outputs": [...]} (also as a JSON string); outputs are compared
             line by line with trailing spaces and trailing blank lines ignored

assert and check go through `postrl.sandbox.judge`: the program runs once recording what its
function returns, and the tests are judged in a separate run that executes none of its code, so
a reply that calls sys.exit(0) before the tests, patches the harness or lies in `__eq__` fails.
io runs the program once per case with that case's stdin; it passes only when every run exits
0 within its limits and prints the expected output.

Reward, as the `code` domain's (`WEIGHTS`, its params' defaults; `score_verdict` for both): 0.2 *
compiles + 0.8 * all tests pass - 0.1 * (timed out, out of memory, output flood), with the
components compiles, tests, tests_frac, penalty_* (a recipe's `reward:` reweights them).
"""

from __future__ import annotations

import ast
import builtins
import json
import textwrap
from collections.abc import Sequence
from typing import Any

from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards.extract import make_extractor
from postrl.rewards.sandbox_handle import SandboxHandle
from postrl.rewards.verifiers import VERIFIERS, VerifierSettings
from postrl.sandbox.judge import CodeJudge, CodeProblem, CodeVerdict, JudgeLimits, RewardWeights, code_reward
from postrl.sandbox.runs import RunRequest, RunResult, SandboxConfig

TEST_STYLES = ("assert", "check", "io")
WEIGHTS = RewardWeights(compiles=0.2, tests=0.8, timeout=0.1, memory=0.1, output=0.1)
"""The code reward's weights: this verifier's, and the defaults of the `code` domain's `w_*` params."""
CODE_COMPONENTS = ("compiles", "tests", "tests_frac", "penalty_timeout", "penalty_memory", "penalty_output")
"""The components of a code score (`postrl.sandbox.judge.code_reward`'s), which `reward:` may weight."""


# ---------------------------------------------------------------------------- reading tests


def read_tests(style: str, value: Any) -> Any:
    """A row's tests in the form the verifier runs: assert -> the `check(candidate)` source made
    of the lines; check -> the source as given; io -> [(stdin, expected stdout), ...]. Raises
    ValueError saying what is wrong with the value."""
    if style == "assert":
        lines = value.splitlines() if isinstance(value, str) else value
        if not isinstance(lines, list) or not lines or not all(isinstance(x, str) for x in lines):
            raise ValueError("expected a non-empty list of assert lines (or one string of them)")
        test = "def check(candidate):\n" + "\n".join(textwrap.indent(x, "    ") for x in lines if x.strip())
        _parse(test)
        return test
    if style == "check":
        if not isinstance(value, str) or "def check(" not in value:
            raise ValueError("expected Python source defining check(candidate)")
        _parse(value)
        return value
    return _read_io(json.loads(value) if isinstance(value, str) else value)


def _parse(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"not valid Python ({e.msg}, line {e.lineno})") from None


def _read_io(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        ins, outs = value.get("inputs"), value.get("outputs")
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError("expected {inputs: [...], outputs: [...]} of equal length")
        value = [{"input": i, "output": o} for i, o in zip(ins, outs)]
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty list of {input, output} cases")
    cases = []
    for case in value:
        if not isinstance(case, dict) or not isinstance(case.get("input"), str) or not isinstance(case.get("output"), str):
            raise ValueError("every io case needs string fields input and output")
        cases.append((case["input"], case["output"]))
    return cases


def infer_entry_point(test: str) -> str:
    """The first function the asserts of a `check(candidate)` source call that is not a builtin.

    >>> infer_entry_point(read_tests("assert", ["assert len(f(2)) == 1", "assert is_odd(3)"]))
    'f'
    """
    for node in ast.walk(_parse(test)):
        if isinstance(node, ast.Assert):
            for call in ast.walk(node.test):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and not hasattr(builtins, call.func.id) and call.func.id != "candidate"):
                    return call.func.id
    raise ValueError("cannot tell which function the asserts test; name it with entry_point")


def _same_output(got: str, want: str) -> bool:
    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return norm(got) == norm(want)


def _compiles(code: str) -> bool:
    try:  # the compiler only: nothing of the reply runs here
        compile(code, "<reply>", "exec")
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


# ---------------------------------------------------------------------------- the verifier


class CodeVerifier:
    def __init__(self, arg: str, settings: VerifierSettings):
        if settings.tests_style not in TEST_STYLES:
            raise UserError(f"tests_style = {settings.tests_style!r}: expected one of {', '.join(TEST_STYLES)}")
        self.settings = settings
        self.style = settings.tests_style
        self.extract_spec = settings.extract or "code_fence"
        self.extractor = make_extractor(self.extract_spec, "domains.NAME.params.extract")
        self.limits = JudgeLimits(timeout_s=settings.timeout_s, memory_mb=settings.memory_mb)
        self.sandbox = SandboxHandle(settings, "verifier code", f"{settings.params_key}allow_unisolated")

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        """Every task carries `meta["tests"]` (as `read_tests` returns them) and, for assert and
        check, `meta["entry_point"]`."""
        codes = [self.extractor(r.text) or "" for r in responses]
        if self.style == "io":
            verdicts = self._run_io(tasks, codes)
        else:
            problems = [CodeProblem(t.task_id, "", t.meta["tests"], t.meta["entry_point"]) for t in tasks]
            verdicts = CodeJudge(self.backend(), self.limits).judge(problems, codes)
        return [score_verdict(v, WEIGHTS, extracted=code) for v, code in zip(verdicts, codes)]

    def _run_io(self, tasks: Sequence[Task], codes: list[str]) -> list[CodeVerdict]:
        lim = self.limits
        jobs = [(i, want) for i, t in enumerate(tasks) for _, want in t.meta["tests"]]
        reqs = [RunRequest(codes[i], stdin=stdin, timeout_s=lim.timeout_s, memory_mb=lim.memory_mb,
                           max_output_bytes=lim.max_output_bytes)
                for i, t in enumerate(tasks) for stdin, _ in t.meta["tests"]]
        runs: dict[int, list[tuple[RunResult, str]]] = {}
        for (i, want), run in zip(jobs, self.backend().run_many(reqs) if reqs else []):
            runs.setdefault(i, []).append((run, want))
        return [_io_verdict(t.task_id, codes[i], runs.get(i, [])) for i, t in enumerate(tasks)]

    # -- the sandbox, started on first use (the `code` domain's arrangement) -----------------------

    def backend(self):
        return self.sandbox.get()

    def sandbox_config(self) -> SandboxConfig | None:
        """The local pool this verifier runs on; None when it uses a sandbox server."""
        return self.sandbox.config

    def use_sandbox(self, backend) -> None:
        """Run on `backend` (the Ray engine's sandbox actor) instead of a pool of this process's own."""
        self.sandbox.use(backend)

    def close(self) -> None:
        self.sandbox.close()


def _io_verdict(task_id: str, code: str, runs: list[tuple[RunResult, str]]) -> CodeVerdict:
    v = CodeVerdict(task_id, compiles=_compiles(code), passed=False,
                    isolation=runs[0][0].isolation if runs else "")
    lost = [r for r, _ in runs if r.status == "error" and not r.worker_lost]
    if lost:
        v.status, v.detail = "error", f"sandbox error: {lost[0].message}"
        return v
    v.tests = [r.status == "finished" and r.exit_code == 0 and _same_output(r.stdout, want) for r, want in runs]
    v.timeout = any(r.status == "timeout" for r, _ in runs)
    v.output = any(r.status == "output_limit" for r, _ in runs)
    v.memory = any(r.memory_exceeded for r, _ in runs)
    v.passed = v.compiles and bool(v.tests) and all(v.tests)
    v.detail = f"{sum(v.tests)}/{len(v.tests)} cases passed"
    return v


def score_verdict(v: CodeVerdict, weights: RewardWeights, extracted: str | None = None) -> Score:
    """The Score of a judged program, for the `code` verifier and the `code` domain: reward by
    `weights` (0 when the sandbox could not judge it: correct None, its status), components, and
    per-test results in the detail (`tests=1101`)."""
    reward, comps = code_reward(v, weights)
    tests = "".join("1" if t else "0" for t in v.tests)
    detail = f"{v.detail} | tests={tests or '-'} | isolation={v.isolation}"
    if v.status != "ok":
        return Score(0.0, None, v.status, comps, detail, extracted=extracted)
    return Score(reward, v.passed, "ok", comps, detail, extracted=extracted)


VERIFIERS.add("code", CodeVerifier, components=CODE_COMPONENTS, needs_answer=False)
