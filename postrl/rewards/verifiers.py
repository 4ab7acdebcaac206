"""Verifiers chosen by name: reward functions that also say right or wrong.

    v = make_verifier("numeric", VerifierSettings(tolerance=1e-3))
    v.score(tasks, responses)      # one Score per response: reward, correct, status, extracted

| name | graded | reference (`Task.answer`) |
|---|---|---|
| `math` | math-verify in the supervised pool (`postrl.rewards.math`) | LaTeX or plain math |
| `exact` | the extracted answer equals the reference (surrounding spaces ignored) | text |
| `numeric` | within `tolerance` x max(1, |reference|) of the reference | a number, `3/4`, `1,200`, `$5`, `40%` |
| `choice` | the multiple-choice letter in the extracted answer | a letter (`B`, `(B)`) |
| `regex` | the extracted answer fully matches the reference pattern | a regular expression |
| `code` | extracted Python run against the task's tests in the sandbox (`postrl.rewards.code_verifier`) | - |
| `python:MODULE:FUNCTION` | a user function in supervised workers (`postrl.rewards.user_reward`) | any column |
| `rm:DIR` | a reward model trained by `postrl rm train` (sigmoid of its score; no verdict) | - |

Each verifier first takes the answer out of the reply with its extractor (`postrl.rewards.extract`,
the setting `extract`; each verifier has a default), after removing any `<think>` section. A reply
with no answer in the requested form is wrong (correct False, status ok); a reference that cannot
be read (`numeric` of "n/a", a bad regex) or a verifier that failed is "could not verify"
(correct None, status error or timeout), which the trainer never turns into a silent zero.

    >>> s = VerifierSettings()
    >>> [x.correct for x in make_verifier("numeric", s).grade(["0.5", "1/2"], ["x = 1/2", "0.50001"])]
    [True, False]
    >>> make_verifier("choice", s).grade(["B"], ["The answer is (B)."])[0].extracted
    'B'
    >>> make_verifier("regex", s).grade([r"\\d+ apples"], ["12 apples"])[0].correct
    True
    >>> make_verifier("exact", s).grade(["Paris"], ["<think>Lyon?</think> Paris "])[0].correct
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Protocol

from postrl.abilities import check_abilities
from postrl.errors import ConfigError
from postrl.records import Response, Score, Task
from postrl.registry import Registry
from postrl.rewards.extract import make_extractor
from postrl.sandbox.settings import SandboxSettings


@dataclass
class VerifierSettings(SandboxSettings):
    """What a verifier may be configured with (a dataset domain's params pass them on); the
    sandbox's and the user reward workers' settings (`timeout_s`, `workers`, ...) are the shared
    `SandboxSettings`."""

    extract: str = ""
    """Extractor name; empty = the verifier's default."""
    tolerance: float = 1e-6
    """numeric: relative tolerance, |answer - reference| <= tolerance * max(1, |reference|)."""
    tests_style: str = "assert"
    """code: assert | check | io."""
    base_dir: str = ""
    """Directory that `rm:DIR` and user modules resolve against (the recipe's)."""
    rm_batch_size: int = 0
    """rm:DIR: inputs per forward pass of the reward model; 0 = the model's own (postrl_rm.json)."""
    rm_device: str = "cpu"
    """rm:DIR: where the reward model runs (cpu, cuda, cuda:N)."""
    params_key: str = "domains.NAME.params."
    """Where a recipe writes these settings, for messages (a dataset domain's `domains.NAME.params.`)."""


class Verifier(Protocol):
    extract_spec: str

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]: ...

    def close(self) -> None: ...


def no_argument(arg: str, base_dir: str) -> str:
    """A verifier's argument check when it takes none (`exact`, not `exact:x`)."""
    return "this verifier takes no argument" if arg else ""


@dataclass(frozen=True)
class VerifierFacts:
    """What a verifier's registration says about it."""

    components: tuple[str, ...] = ()
    """The components its scores carry: the terms a recipe's `reward:` may weight."""
    needs_answer: bool = True
    """Whether it grades against a reference (a dataset domain's `answer` column)."""
    check_argument: Callable[[str, str], str] = no_argument
    """(argument, base_dir) -> what is wrong with the argument after `NAME:`, '' when nothing is."""


VERIFIERS: Registry[VerifierFacts] = Registry("verifier", facts=VerifierFacts)
"""Name -> factory(argument, VerifierSettings) -> Verifier, with its `VerifierFacts`.
`python:MODULE:FUNCTION` is the entry `python` with the argument MODULE:FUNCTION, `rm:DIR` the
entry `rm` with DIR. The config key is `domains.NAME.params.verifier`."""

ANSWER_COMPONENTS = ("correct",)


def verifier_name(spec: str) -> tuple[str, str]:
    """('python', 'mod:fn') for 'python:mod:fn'; ('exact', '') for 'exact'."""
    name, _, arg = spec.partition(":")
    return name, arg


def verifier_facts(spec: str, key: str = "") -> VerifierFacts:
    """The registered facts of the verifier `spec` names (ConfigError naming `key` if none)."""
    return VERIFIERS.facts(verifier_name(spec)[0], key)


def all_components() -> tuple[str, ...]:
    """Every component some registered verifier's scores carry, in registry order."""
    return tuple(dict.fromkeys(c for _, facts in VERIFIERS.all_facts() for c in facts.components))


def check_verifier(spec: str, key: str = "", base_dir: str = "") -> None:
    """ConfigError naming `key` unless `spec` names a verifier with a well-formed argument."""
    name, arg = verifier_name(spec)
    problem = VERIFIERS.facts(name, key).check_argument(arg, base_dir)
    if problem:
        raise ConfigError(f"config key '{key}' = {spec!r}: {problem}")


def make_verifier(spec: str, settings: VerifierSettings, key: str = "") -> Verifier:
    check_verifier(spec, key, settings.base_dir)
    name, arg = verifier_name(spec)
    verifier = VERIFIERS.get(name)(arg, settings)
    check_abilities(verifier, f"verifier {spec}")
    return verifier


# ---------------------------------------------------------------------------- answer verifiers


class GoldUnreadable(ValueError):
    """The reference answer cannot be read: the verdict is 'could not verify'."""


Compare = Callable[[str, str], "bool | None"]
"""(reference, extracted answer) -> right or wrong; None: no answer of the right kind in it."""


class AnswerVerifier:
    """Extract, then compare with the reference, in this process (the comparisons are cheap)."""

    def __init__(self, compare: Compare, settings: VerifierSettings, default_extract: str,
                 normalize: Callable[[str], str | None] | None = None):
        self.compare = compare
        self.normalize = normalize
        """Turns the extracted text into the answer graded (choice: the letter), None: no answer."""
        self.extract_spec = settings.extract or default_extract
        self.extractor = make_extractor(self.extract_spec, "domains.NAME.params.extract")

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        return self.grade([t.answer for t in tasks], [r.text for r in responses])

    def grade(self, golds: Sequence[str], replies: Sequence[str]) -> list[Score]:
        answers = [self.extractor(text) for text in replies]
        if self.normalize is not None:
            answers = [None if a is None else self.normalize(a) for a in answers]
        return [self._one(str(g), a) for g, a in zip(golds, answers, strict=True)]

    def _one(self, gold: str, answer: str | None) -> Score:
        try:
            right = None if answer is None else self.compare(gold, answer)
        except GoldUnreadable as e:
            return Score(0.0, None, "error", {}, f"reference {gold[:60]!r}: {e}", extracted=answer)
        if right is None:
            return Score(0.0, False, "ok", {"correct": 0.0}, "no answer in the requested form", extracted=answer)
        return Score(float(right), right, "ok", {"correct": float(right)}, extracted=answer)

    def close(self) -> None:
        pass


def _register_answer(name: str, default_extract: str, make_compare: Callable[[VerifierSettings], Compare],
                     normalize: Callable[[str], str | None] | None = None) -> None:
    def make(arg: str, settings: VerifierSettings) -> AnswerVerifier:
        return AnswerVerifier(make_compare(settings), settings, default_extract, normalize)

    VERIFIERS.add(name, make, components=ANSWER_COMPONENTS)


def exact(gold: str, answer: str) -> bool:
    """Equal after stripping surrounding whitespace (case and inner spaces count)."""
    return answer.strip() == gold.strip()


_NUM = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def parse_number(text: str) -> Fraction | None:
    """`1,250.5`, `-3/4`, `$5`, `40%` (as 40), `1e3` -> an exact Fraction; None when not a number.

    >>> parse_number("$1,250.50"), parse_number("3/4"), parse_number("1e3"), parse_number("n/a")
    (Fraction(2501, 2), Fraction(3, 4), Fraction(1000, 1), None)
    """
    t = text.strip().replace(",", "").replace("$", "").rstrip("%").strip()
    try:
        if "/" in t:
            num, den = t.split("/", 1)
            return Fraction(Fraction(num.strip()), Fraction(den.strip()))
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def numeric_within(tolerance: float) -> Compare:
    """Numerically equal: |answer - reference| <= tolerance * max(1, |reference|)."""

    def numeric(gold: str, answer: str) -> bool | None:
        ref = parse_number(gold)
        if ref is None:
            raise GoldUnreadable("not a number")
        got = parse_number(answer)
        if got is None:  # "x = 42": the last number in the extracted text
            found = _NUM.findall(answer)
            got = parse_number(found[-1]) if found else None
        if got is None:
            return None
        return abs(float(got - ref)) <= tolerance * max(1.0, abs(float(ref)))

    return numeric


_LETTER = re.compile(r"\(?([A-Z])\)?[.:)]?")
_LETTER_SAID = re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Z])\b\)?", re.IGNORECASE)
_LETTER_BRACKETED = re.compile(r"\(([A-Z])\)")


def choice_letter(text: str) -> str | None:
    """The letter a reply chooses: the whole text is a letter (`B`, `(B)`, `B.`), else what
    'answer is B' / 'option: B' says, else the bracketed capital `(B)`; None when the reply names
    several different letters that way (a hedge, or the options echoed back, is no choice).

    >>> choice_letter("(C)"), choice_letter("I think the answer is b."), choice_letter("maybe")
    ('C', 'B', None)
    >>> choice_letter("(A) x (B) y (C) z"), choice_letter("Not (A): the answer is (C).")
    (None, 'C')
    """
    t = text.strip()
    whole = _LETTER.fullmatch(t)
    if whole:
        return whole.group(1)
    for pattern in (_LETTER_SAID, _LETTER_BRACKETED):
        found = {x.upper() for x in pattern.findall(t)}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def choice(gold: str, letter: str) -> bool:
    """The chosen letter (`choice_letter` of the extracted answer) equals the reference letter."""
    ref = _LETTER.fullmatch(gold.strip().upper())
    if ref is None:
        raise GoldUnreadable("not a choice letter")
    return letter == ref.group(1)


def regex(gold: str, answer: str) -> bool:
    """The reference is a pattern the whole (stripped) answer must match."""
    try:
        pattern = re.compile(gold, re.DOTALL)
    except re.error as e:
        raise GoldUnreadable(f"bad pattern ({e})") from None
    return pattern.fullmatch(answer.strip()) is not None


_register_answer("exact", "none", lambda settings: exact)
_register_answer("numeric", "last_number", lambda settings: numeric_within(settings.tolerance))
_register_answer("choice", "none", lambda settings: choice, normalize=choice_letter)
_register_answer("regex", "none", lambda settings: regex)


# ---------------------------------------------------------------------------- math


class MathAnswer:
    """math-verify through the shared supervised pool (`postrl.rewards.math.default_verifier`).
    With extraction `none` (the default), math-verify finds the answer itself (`\\boxed{}` first,
    then the last expression); with another extractor the extracted text is what it parses."""

    def __init__(self, arg: str, settings: VerifierSettings):
        self.extract_spec = settings.extract or "none"
        self.extractor = make_extractor(self.extract_spec, "domains.NAME.params.extract")

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        return self.grade([t.answer for t in tasks], [r.text for r in responses])

    def grade(self, golds: Sequence[str], replies: Sequence[str]) -> list[Score]:
        from postrl.rewards.math import default_verifier  # starts worker processes: only when used

        answers = [self.extractor(text) for text in replies]
        pairs = [(str(g), a if self.extract_spec == "none" else f"\\boxed{{{a}}}")
                 for g, a in zip(golds, answers, strict=True) if a is not None]
        verdicts = iter(default_verifier().verify(pairs) if pairs else [])
        out = []
        for a in answers:
            if a is None:
                out.append(Score(0.0, False, "ok", {"correct": 0.0}, "no answer in the requested form"))
            else:
                s = next(verdicts)
                s.extracted = a
                out.append(s)
        return out

    def close(self) -> None:
        pass  # the pool is shared by the process and closed at exit


VERIFIERS.add("math", MathAnswer, components=ANSWER_COMPONENTS)


# ---------------------------------------------------------------------------- reward models


class RewardModelVerifier:
    """`rm:DIR`: a reward model's sigmoid score of (prompt, extracted reply) as the reward, with
    component `rm`. It has no notion of right and wrong: correct is None, status ok. The prompt is
    the task's chat messages when it has them (rendered with the model's chat template), else its
    text; replies are scored `rm_batch_size` at a time."""

    def __init__(self, arg: str, settings: VerifierSettings):
        from postrl.model.device import resolve_device
        from postrl.rewards.models.rm import RewardModel  # imports transformers: only for runs that use one

        self.extract_spec = settings.extract or "none"
        self.extractor = make_extractor(self.extract_spec, "domains.NAME.params.extract")
        self.model = RewardModel.load(resolve(arg, settings.base_dir),
                                      resolve_device(settings.rm_device, f"{settings.params_key}rm_device="))
        self.batch_size = settings.rm_batch_size

    def score(self, tasks: Sequence[Task], responses: Sequence[Response]) -> list[Score]:
        from postrl.rewards.models.rm import sigmoid, task_prompt

        answers = [self.extractor(r.text) or "" for r in responses]
        raw = self.model.score([task_prompt(t) for t in tasks], answers, batch_size=self.batch_size)
        return [Score(r, None, "ok", {"rm": r}, extracted=a) for r, a in zip(map(sigmoid, raw), answers)]

    def close(self) -> None:
        pass


def check_reward_model(arg: str, base_dir: str) -> str:
    """'' when `arg` is a reward model directory, else what is wrong."""
    if not arg:
        return "expected rm:DIR, a reward model directory from `postrl rm train`"
    path = resolve(arg, base_dir)
    return "" if (path / "config.json").is_file() else f"no reward model at {path}"


VERIFIERS.add("rm", RewardModelVerifier, components=("rm",), needs_answer=False, check_argument=check_reward_model)


def resolve(path: str, base_dir: str) -> Path:
    """`path`, relative ones taken from `base_dir` (the recipe's directory) when it is set."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or not base_dir else Path(base_dir) / p


# `code` (postrl.rewards.code_verifier) and `python:MODULE:FUNCTION` (postrl.rewards.user_reward)
# register themselves when imported; the dataset domain imports them, so the names are known
# wherever domains are.


class VerifierNames:
    """What `postrl.names` checks `domains.NAME.params.verifier` against."""

    def __init__(self, base_dir: str = ""):
        self.base_dir = base_dir

    def check(self, name: str, key: str = "") -> None:
        check_verifier(name, key, self.base_dir)
