"""Judging programs against unit tests without trusting the judged.

A problem is HumanEval-shaped: `prompt` (signature + docstring), `test` (defines
`check(candidate)` with assertions) and `entry_point`. A solution is scored in two sandbox runs:

1. candidate run: the solution plus a *probe* — the test with every expected value removed
   (assertions that do not involve the candidate are dropped; in those that do, each operand
   of a comparison or arithmetic that does not involve the candidate is replaced by a stand-in
   that compares equal to anything). It records each call of the entry point as plain data:
   the encoded arguments and the encoded return value (exact built-in types only).
2. judge run: the problem's prompt and the original test, with `candidate` replaced by a
   replayer that returns the recorded values. It never executes solution code, so nothing the
   solution did — sys.exit(0), os._exit, atexit, excepthook, threads, objects with a lying
   `__eq__`, patching the harness — can reach the verdict. The replayer checks that the test
   calls the candidate with the same arguments, in the same order, as in the candidate run.

A test passes only if every executed assertion held, the judge consumed exactly the recorded
calls, and the candidate run ended within its limits.

    reward = w_compiles * compiles + w_tests * all_tests_pass
             - w_timeout * timed_out - w_memory * out_of_memory - w_output * output_flood
"""

from __future__ import annotations

import ast
import copy
import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from postrl.sandbox.runs import RunRequest, RunResult

_RUNTIME = (Path(__file__).parent / "_runtime.py").read_text()
MARK = "\x1ePOSTRL-RECORD "


class Backend(Protocol):
    """Anything that runs a batch of programs: `SandboxPool` or `RemoteSandbox`."""

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]: ...


@dataclass(frozen=True)
class CodeProblem:
    task_id: str
    prompt: str
    test: str
    entry_point: str


@dataclass
class CodeVerdict:
    task_id: str
    compiles: bool
    passed: bool
    tests: list[bool] = field(default_factory=list)
    """Result of each assertion the test executed, in order."""
    timeout: bool = False
    memory: bool = False
    output: bool = False
    status: str = "ok"
    """ok: a verdict was reached; error/timeout: the judge itself failed (no verdict)."""
    isolation: str = ""
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RewardWeights:
    compiles: float = 0.2
    tests: float = 0.8
    timeout: float = 0.0
    memory: float = 0.0
    output: float = 0.0


def code_reward(v: CodeVerdict, w: RewardWeights) -> tuple[float, dict[str, float]]:
    """Reward and its raw components (0/1 indicators, fraction for tests_frac).

    >>> code_reward(CodeVerdict("t", compiles=True, passed=False, timeout=True), RewardWeights(timeout=0.1))[0]
    0.1
    """
    c = {
        "compiles": float(v.compiles),
        "tests": float(v.passed),
        "tests_frac": sum(v.tests) / len(v.tests) if v.tests else 0.0,
        "penalty_timeout": float(v.timeout),
        "penalty_memory": float(v.memory),
        "penalty_output": float(v.output),
    }
    reward = (w.compiles * c["compiles"] + w.tests * c["tests"] - w.timeout * c["penalty_timeout"]
              - w.memory * c["penalty_memory"] - w.output * c["penalty_output"])
    return round(reward, 10), c


# --- test rewriting (trusted side, on the problem's text only) -------------------------------


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


class _Hide(ast.NodeTransformer):
    """Replace expected values next to the candidate's results with the _RT_H stand-in."""

    def __init__(self, cand: str):
        self.cand = cand

    def _hide(self, node: ast.expr) -> ast.expr:
        if _mentions(node, self.cand):
            return self.visit(node)
        return ast.copy_location(ast.Name("_RT_H", ast.Load()), node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        node.left = self._hide(node.left)
        node.comparators = [self._hide(c) for c in node.comparators]
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        node.left, node.right = self._hide(node.left), self._hide(node.right)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == self.cand:
            return node  # the arguments are the test's inputs: kept as they are
        return self.generic_visit(node)


class _Probe(ast.NodeTransformer):
    def __init__(self, cand: str):
        self.cand = cand

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        if not _mentions(node.test, self.cand):
            return ast.copy_location(ast.Pass(), node)
        test = _Hide(self.cand).visit(node.test)
        return _call_stmt("_rt_probe", test, node)


class _Judge(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        return _call_stmt("_rt_assert", node.test, node)


def _call_stmt(fn: str, body: ast.expr, where: ast.AST) -> ast.stmt:
    args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    call = ast.Call(ast.Name(fn, ast.Load()), [ast.Lambda(args, body)], [])
    return ast.fix_missing_locations(ast.copy_location(ast.Expr(call), where))


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.old and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Name(self.new, ast.Load()), node)
        return node


@functools.lru_cache(maxsize=4096)
def split_test(test: str, entry_point: str) -> tuple[str, str]:
    """(probe, judge) versions of a test defining `check(candidate)`."""
    tree = ast.parse(test)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks or not checks[0].args.args:
        raise ValueError("the test must define check(candidate)")
    cand = checks[0].args.args[0].arg
    # Some tests call the solution by its name instead of through `candidate` (HumanEval/33):
    # in the test that name means the candidate, so it is recorded and replayed like one.
    _Rename(entry_point, cand).visit(checks[0])
    probe = _Probe(cand).visit(copy.deepcopy(tree))
    judge = _Judge().visit(copy.deepcopy(tree))
    return ast.unparse(probe), ast.unparse(judge)


def _runtime(preloaded: bool, fn: str) -> str:
    # A local pool has the runtime preloaded in its workers; a remote server gets the source.
    return f"from _postrl_runtime import {fn}\n" if preloaded else _RUNTIME + "\n"


def candidate_program(problem: CodeProblem, completion: str, preloaded: bool = False) -> str:
    probe, _ = split_test(problem.test, problem.entry_point)
    src = problem.prompt + completion
    return f"{_runtime(preloaded, '_rt_candidate')}_rt_candidate({src!r}, {probe!r}, {problem.entry_point!r})\n"


def judge_program(items: list[tuple[CodeProblem, list[dict]]], preloaded: bool = False) -> str:
    """One judge run for several (problem, recorded calls) pairs."""
    payload = [[p.prompt, split_test(p.test, p.entry_point)[1], json.dumps(calls)] for p, calls in items]
    return f"{_runtime(preloaded, '_rt_judge')}_rt_judge({json.dumps(payload)!r})\n"


def parse_records(stdout: str) -> list[dict]:
    out = []
    for line in stdout.split("\n"):
        if line.startswith(MARK):
            try:
                rec = json.loads(line[len(MARK):])
            except ValueError:
                rec = {"malformed": True}
            out.append(rec if isinstance(rec, dict) else {"malformed": True})
    return out


# --- orchestration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeLimits:
    timeout_s: float = 3.0
    """Wall-clock limit of the candidate run (the whole test)."""
    memory_mb: int = 512
    judge_timeout_s: float = 10.0
    max_output_bytes: int = 8 << 20
    """Records travel on stdout, so this also bounds the recorded return values."""


@dataclass
class _CandidateRun:
    compiled: bool = False
    calls: list[dict] = field(default_factory=list)
    done: bool = False
    problem: str = ""
    memory: bool = False


def _read_candidate(r: RunResult) -> _CandidateRun:
    recs = parse_records(r.stdout)
    out = _CandidateRun()
    # The first record is written before any solution code runs, so it cannot be forged.
    if not recs or recs[0].get("compiled") is not True:
        out.problem = str(recs[0].get("error", "did not compile")) if recs else "no output from the harness"
        return out
    out.compiled = True
    for rec in recs[1:]:
        if "call" in rec:
            if rec["call"] != len(out.calls) or not isinstance(rec.get("args"), str):
                out.problem = "inconsistent call records"
                break
            out.calls.append({k: rec[k] for k in ("args", "ret", "exc") if k in rec})
        elif rec.get("done") is True:
            out.done = True
        elif "module_error" in rec or "check_error" in rec:
            out.problem = out.problem or str(rec.get("module_error") or rec.get("check_error"))
        else:
            out.problem = "malformed record"
    errors = [c.get("exc") for c in out.calls] + [out.problem]
    out.memory = r.memory_exceeded or "MemoryError" in errors
    return out


class CodeJudge:
    """Scores solutions of HumanEval-shaped problems on a sandbox backend."""

    def __init__(self, backend: Backend, limits: JudgeLimits | None = None):
        self.backend = backend
        self.limits = limits or JudgeLimits()

    def judge(self, problems: list[CodeProblem], completions: list[str]) -> list[CodeVerdict]:
        if len(problems) != len(completions):
            raise ValueError("one completion per problem")
        lim = self.limits
        pre = "_postrl_runtime" in getattr(self.backend, "preloaded", ())
        reqs = [
            RunRequest(candidate_program(p, c, pre), timeout_s=lim.timeout_s, memory_mb=lim.memory_mb,
                       max_output_bytes=lim.max_output_bytes)
            for p, c in zip(problems, completions)
        ]
        runs = self.backend.run_many(reqs)
        cands = [_read_candidate(r) for r in runs]
        todo = [i for i, c in enumerate(cands) if c.compiled and runs[i].status != "error"]
        judged = self._judge_runs(problems, cands, todo, pre)
        return [_verdict(p, runs[i], cands[i], judged.get(i)) for i, p in enumerate(problems)]

    def _judge_runs(self, problems, cands, todo: list[int], pre: bool) -> dict[int, dict]:
        """Judge records by problem index; a failed judge run gives {"failed": status, ...}."""
        lim = self.limits
        # Judge runs execute no solution code, so several problems share one run: fewer
        # sandbox runs, with still one batch per worker to keep them all busy.
        per_run = max(1, min(16, -(-len(todo) // max(1, getattr(self.backend, "n_workers", 4)))))
        batches = [todo[k:k + per_run] for k in range(0, len(todo), per_run)]
        reqs = [
            RunRequest(judge_program([(problems[i], cands[i].calls) for i in b], pre),
                       timeout_s=lim.judge_timeout_s * len(b), memory_mb=max(lim.memory_mb, 512),
                       max_output_bytes=lim.max_output_bytes)
            for b in batches
        ]
        out: dict[int, dict] = {}
        for batch, run in zip(batches, self.backend.run_many(reqs)):
            recs = {r.get("index"): r for r in parse_records(run.stdout) if "judge" in r}
            for k, i in enumerate(batch):
                ok = run.status == "finished" and k in recs
                out[i] = recs[k] if ok else {"failed": run.status, "stderr": run.stderr[-300:]}
        return out


def _verdict(p: CodeProblem, run: RunResult, cand: _CandidateRun, j: dict | None) -> CodeVerdict:
    v = CodeVerdict(p.task_id, compiles=cand.compiled, passed=False, isolation=run.isolation)
    v.timeout = run.status == "timeout"
    v.output = run.status == "output_limit"
    v.memory = cand.memory
    if run.status == "error" and not run.worker_lost:
        v.status, v.detail = "error", f"sandbox error: {run.message}"
        return v
    if j is None:
        v.detail = _limit_note(v, run) or cand.problem or "not judged"
        return v
    if "failed" in j:
        v.status = "timeout" if j["failed"] == "timeout" else "error"
        v.detail = f"judge run failed ({j['failed']}): {j.get('stderr', '')}"
        return v
    v.tests = [x is True for x in j.get("judge", [])]
    clean = run.status == "finished" and not run.worker_lost and cand.done and not cand.problem
    agreed = not j.get("diverged") and j.get("consumed") == len(cand.calls) and j.get("check_error") is None
    v.passed = bool(clean and agreed and v.tests and all(v.tests))
    v.detail = _detail(v, run, cand, j)
    return v


def _limit_note(v: CodeVerdict, run: RunResult) -> str:
    if run.worker_lost:
        return "the program killed its sandbox"
    if v.timeout:
        return "time limit exceeded"
    if v.output:
        return "output limit exceeded"
    return "out of memory" if v.memory else ""


def _detail(v: CodeVerdict, run: RunResult, cand: _CandidateRun, j: dict) -> str:
    parts = [f"{sum(v.tests)}/{len(v.tests)} assertions held"]
    if not all(v.tests) and v.tests:
        parts.append(f"first failure #{v.tests.index(False)}")
    note = _limit_note(v, run) or cand.problem or j.get("diverged") or j.get("check_error")
    if note:
        parts.append(str(note))
    return "; ".join(parts)
