"""Domain `dataset`: problems from the user's own file, graded by a named verifier.

    domains:
      gsm:
        type: dataset
        params:
          path: data/gsm_train.jsonl          # .jsonl .json .parquet .csv or a save_to_disk directory
          heldout_path: data/gsm_test.jsonl   # or heldout_percent: 10 (a fixed hash split)
          prompt: "{question}"                # a format string over the row's columns
          system: "Put your final answer in \\boxed{}."
          answer: answer                      # the column holding the reference
          verifier: math                      # postrl.rewards.verifiers
          extract: boxed                      # postrl.rewards.extract

      mbpp:
        type: dataset
        params: {path: mbpp.jsonl, prompt: "{text}", verifier: code, tests: test_list, tests_style: assert}

      mixed:                                  # verl's layout: one file, a domain per data_source
        type: dataset
        params: {path: train.parquet, messages: prompt, answer: reward_model.ground_truth,
                 split_by: data_source, verifiers: {openai/gsm8k: math, my/trivia: exact}}

Relative paths resolve against the recipe's directory (`base_dir`, filled from `Config.base_dir`).
Files are read by `postrl.tasks.dataset_files`; nothing is downloaded.

A param that names a column takes a dotted path into nested values (`lookup`): Parquet structs,
JSON objects and `datasets` features, `reward_model.ground_truth`, `{extra_info.question}` in a
prompt, a number indexing a list (`prompt.0.content`); a column whose own name has a dot wins.

`split_by`: the config makes one domain per value of `verifiers` (`postrl.config.checks.split_domains`,
named `NAME/VALUE`, each with `split_value` and every `split_values`); each reads the whole file and
keeps its value's rows. A row whose value has no verifier is a bad row, reported once, by the first
of them, as a row that belongs to none of them is.

A row becomes a `Task`: `prompt` is the formatted user turn (for `messages: COLUMN`, the last user
message), `messages` the system prompt (when given) and the user turn, or the row's own chat
messages; `answer` the reference as text, where a GSM8K-style reference (`...#### 72`) is reduced
to what follows its last `####`; `level` the `level` column's integer (`3` or `"Level 3"`; 0
without one); `meta["row"]` every column of the row, which the rollout store keeps with each
sample (`task_columns`). The task id is a hash of the row, so the same row has the same id.

A malformed row (a column missing or empty, a dotted path with a part missing, a value of the wrong
type, tests that are not Python, a `split_by` value with no verifier) stops the build with one line
naming `FILE:LINE`, the column and the missing part, or, with `on_bad_row: skip`, is left out,
counted in `skipped` and reported in one line on stderr.

Held out: the rows of `heldout_path`, or else a fixed `heldout_percent` of `path` (10 by default)
chosen by a hash of the prompt, so the split never depends on a seed and a repeated question
falls on one side. Training never draws a held-out row.

Drawing: a finite data set is drawn in epochs, without replacement within one. At the start of
each epoch the order is a permutation drawn from the sampler's random stream, and the order and
the position in it are this domain's state (`state_dict`), saved with every checkpoint, so a
resumed run draws exactly the rows the uninterrupted run would have. A draw for a given level
takes the next row of that level in the epoch; with none left in it, a random row of that level.
A row the curriculum rejects counts as drawn for that epoch.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from postrl.abilities import RunsCode
from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards import code_verifier, user_reward  # noqa: F401  (register the verifiers code and python)
from postrl.rewards.code_verifier import infer_entry_point, read_tests
from postrl.rewards.verifiers import VerifierSettings, all_components, make_verifier, resolve, verifier_facts
from postrl.sandbox.settings import SandboxSettings, sandbox_settings
from postrl.tasks.base import is_heldout, parse_params, register_domain
from postrl.tasks.dataset_files import BadRow, read_rows

_GSM_FINAL = "####"
_LEVEL = re.compile(r"-?\d+")


@dataclass
class DatasetParams(SandboxSettings):
    path: str = ""
    """The training rows: .jsonl, .json (array or lines), .parquet, .csv, or a save_to_disk directory."""
    heldout_path: str = ""
    """Held-out rows in a file of their own; empty = a hash split of `path`."""
    heldout_percent: int | None = None
    """Share of `path` held out by a hash of the prompt, in percent (default 10; 0 with heldout_path)."""
    prompt: str = ""
    """Format string over the row's columns, e.g. "{question}"; or use `messages`."""
    messages: str = ""
    """The column holding chat messages [{role, content}, ...] (instead of `prompt`)."""
    system: str = ""
    """System prompt put before the user turn."""
    answer: str = ""
    """The column holding the reference answer."""
    verifier: str = ""
    """math | exact | numeric | choice | regex | code | python:MODULE:FUNCTION | rm:DIR."""
    extract: str = ""
    """boxed | hash | tag:NAME | last_number | code_fence | none; empty = the verifier's default."""
    tolerance: float = 1e-6
    """numeric: relative tolerance."""
    tests: str = ""
    """code: the column holding the tests."""
    tests_style: str = "assert"
    """code: assert (MBPP) | check (HumanEval) | io (stdin/stdout)."""
    entry_point: str = ""
    """code: the column naming the function under test (assert: inferred from the asserts if empty)."""
    level: str = ""
    """The column holding a difficulty level for the curriculum (an integer, or text with one)."""
    on_bad_row: str = "error"
    """error: a malformed row stops the run; skip: it is left out and counted."""
    split_by: str = ""
    """The column (or dotted path) whose value picks a row's domain: one file, several tasks (verl's
    `data_source`); give `verifiers: {VALUE: verifier or params}` and the config makes one domain per value."""
    split_value: str = ""
    """split_by: the value whose rows this domain keeps (filled from `verifiers` by the config)."""
    split_values: list[str] = field(default_factory=list)
    """split_by: every value given a verifier; a row with another value is a bad row (filled by the config)."""
    rm_batch_size: int = 0
    """rm:DIR: replies per forward pass of the reward model; 0 = the model's own (`postrl rm train --score-batch-size`)."""
    rm_device: str = "cpu"
    """rm:DIR: where the reward model runs (cpu, cuda, cuda:N)."""
    base_dir: str = ""
    """Directory relative paths resolve against; empty = the recipe's (`Config.base_dir`)."""


class RowError(Exception):
    """A malformed row: the column and what is wrong with it."""

    def __init__(self, column: str, problem: str):
        super().__init__(problem)
        self.column, self.problem = column, problem

    def at(self, where: str) -> str:
        """`FILE:LINE: column 'answer': missing`."""
        return f"{where}: {f'column {self.column!r}: ' if self.column else ''}{self.problem}"


# The type's components are every built-in verifier's (what `reward:` may weight before the domain
# is built); an instance has its own verifier's.
@register_domain("dataset", components=all_components(), uses_base_dir=True)
class Dataset:
    def __init__(self, params: dict, seed: int, name: str = "dataset"):
        self.name = name
        self.params: DatasetParams = parse_params(DatasetParams, params, name)
        self._validate()
        p = self.params
        settings = VerifierSettings(**asdict(sandbox_settings(p)), extract=p.extract, tolerance=p.tolerance,
                                    tests_style=p.tests_style, base_dir=p.base_dir, rm_batch_size=p.rm_batch_size,
                                    rm_device=p.rm_device,
                                    params_key=self._key(""))
        self.verifier = make_verifier(p.verifier, settings, key=self._key("verifier"))
        self.reward_components = verifier_facts(p.verifier).components
        self.skipped: list[str] = []
        """`FILE:LINE: problem` of each row left out (on_bad_row: skip)."""
        self._train, self._heldout = self._load()
        self.levels = sorted({t.level for t in self._train})
        self._order: list[int] = []
        self._cursor = 0
        self.epoch = 0
        """Epochs begun over the training rows (1 after the first draw)."""

    def _key(self, field: str) -> str:
        return f"domains.{self.name}.params.{field}"

    def _validate(self) -> None:
        p = self.params
        if not p.path:
            raise UserError(f"{self._key('path')}: name the file of training rows")
        if bool(p.prompt) == bool(p.messages):
            raise UserError(f"{self._key('prompt')}: give exactly one of prompt (a format string) or messages (a column)")
        if not p.verifier:
            raise UserError(f"{self._key('verifier')}: name a verifier (math, exact, numeric, choice, regex, code, ...)")
        kind = p.verifier.split(":", 1)[0]
        if not p.answer and verifier_facts(p.verifier, self._key("verifier")).needs_answer:
            raise UserError(f"{self._key('answer')}: the verifier {p.verifier} needs the column of reference answers")
        if kind == "code" and not p.tests:
            raise UserError(f"{self._key('tests')}: the code verifier needs the column of tests")
        if kind == "code" and p.tests_style == "check" and not p.entry_point:
            raise UserError(f"{self._key('entry_point')}: tests_style check needs the column naming the function")
        if p.split_by and p.split_value not in p.split_values:
            raise UserError(f"{self._key('split_by')}: give a verifier per value (verifiers: {{VALUE: verifier}})")
        if p.on_bad_row not in ("error", "skip"):
            raise UserError(f"{self._key('on_bad_row')} = {p.on_bad_row!r}: expected error or skip")
        percent = p.heldout_percent
        if percent is not None and not (0 <= percent < 100 and (percent > 0 or p.heldout_path)):
            raise UserError(f"{self._key('heldout_percent')} = {percent}: must be in 1..99 (0 only with heldout_path)")

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> tuple[list[Task], list[Task]]:
        p = self.params
        rows = self._tasks(resolve(p.path, p.base_dir))
        percent = p.heldout_percent if p.heldout_percent is not None else (0 if p.heldout_path else 10)
        train = [t for t in rows if not (percent and is_heldout(_split_key(t), percent))]
        heldout = [t for t in rows if percent and is_heldout(_split_key(t), percent)]
        if p.heldout_path:
            heldout += self._tasks(resolve(p.heldout_path, p.base_dir))
        if not train:
            raise UserError(f"{self._key('path')}: no training rows in {resolve(p.path, p.base_dir)}")
        if self.skipped:
            print(f"domain {self.name}: skipped {len(self.skipped)} bad rows (first: {self.skipped[0]})",
                  file=sys.stderr)
        return train, heldout

    def _tasks(self, path) -> list[Task]:
        tasks = []
        for where, row in read_rows(path):
            try:
                if isinstance(row, BadRow):
                    raise RowError("", row.problem)
                if self._keeps(row):
                    tasks.append(self.task_of_row(row, where))
            except RowError as e:
                if not self._reports(row):
                    continue
                message = e.at(where)
                if self.params.on_bad_row == "error":
                    raise UserError(f"{message} (domain {self.name}; on_bad_row: skip leaves such rows out)") from None
                self.skipped.append(message)
        return tasks

    def _keeps(self, row: dict[str, Any]) -> bool:
        """Whether the row is this domain's: always, unless the file is split by a column
        (`split_by`), where it must hold this domain's value; a value no domain of the file was
        given a verifier for is a bad row."""
        p = self.params
        if not p.split_by:
            return True
        value = _column(row, p.split_by)
        if str(value) in p.split_values:
            return str(value) == p.split_value
        raise RowError(p.split_by, f"value {value!r} has no verifier (verifiers are given for: "
                                   f"{', '.join(p.split_values)})")

    def _reports(self, row: Any) -> bool:
        """Whether a bad row is this domain's to report. Every domain of a split file reads all of
        it; a row that belongs to none of them (not an object, no value, an unknown value) is
        reported once, by the first, and one that has a value by the domain of that value."""
        p = self.params
        if not p.split_by:
            return True
        try:
            value = str(_column(row, p.split_by)) if isinstance(row, dict) else None
        except RowError:
            value = None
        return value == p.split_value or (value not in p.split_values and p.split_value == p.split_values[0])

    def task_of_row(self, row: dict[str, Any], where: str = "") -> Task:
        """The task of one row; raises `RowError` naming the column when the row is malformed
        (`postrl score` makes the tasks of its input lines here too)."""
        p = self.params
        messages = self._messages(row)
        prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        meta: dict[str, Any] = {"row": row, "source": where, "extract": self.verifier.extract_spec,
                                "conversational": bool(p.system or p.messages)}
        if p.verifier == "code":
            meta.update(self._tests(row))
        answer = _reference(_text(row, p.answer)) if p.answer else ""
        level = _level(row, p.level) if p.level else 0
        digest = hashlib.sha1(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16]
        return Task(self.name, f"{self.name}/{digest}", prompt, answer, level, meta, tuple(messages))

    def _messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        p = self.params
        system = [{"role": "system", "content": p.system}] if p.system else []
        if p.prompt:
            return [*system, {"role": "user", "content": _format(p.prompt, row)}]
        value = _column(row, p.messages)
        if not isinstance(value, list) or not value or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in value):
            raise RowError(p.messages, "expected a non-empty list of {role, content} messages")
        value = [{"role": m["role"], "content": m["content"]} for m in value]
        if not any(m["role"] == "user" for m in value):
            raise RowError(p.messages, "no user message")
        return value if value[0]["role"] == "system" else [*system, *value]

    def _tests(self, row: dict[str, Any]) -> dict[str, Any]:
        p = self.params
        try:
            tests = read_tests(p.tests_style, _column(row, p.tests))
        except (ValueError, json.JSONDecodeError) as e:
            raise RowError(p.tests, str(e)) from None
        if p.tests_style == "io":
            return {"tests": tests, "entry_point": ""}
        if p.entry_point:
            entry = _text(row, p.entry_point)
            if not entry.isidentifier():
                raise RowError(p.entry_point, f"{entry!r} is not a function name")
            return {"tests": tests, "entry_point": entry}
        try:
            return {"tests": tests, "entry_point": infer_entry_point(tests)}
        except ValueError as e:
            raise RowError(p.tests, str(e)) from None

    # -- the domain protocol -------------------------------------------------------------------

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        if self._cursor >= len(self._order):
            self._order = list(range(len(self._train)))
            random.Random(rng.getrandbits(64)).shuffle(self._order)
            self._cursor = 0
            self.epoch += 1
        if level is not None:
            rest = [j for j in range(self._cursor, len(self._order)) if self._train[self._order[j]].level == level]
            if not rest:
                return rng.choice([t for t in self._train if t.level == level] or self._train)
            j = rest[0]
            self._order[self._cursor], self._order[j] = self._order[j], self._order[self._cursor]
        task = self._train[self._order[self._cursor]]
        self._cursor += 1
        return task

    @property
    def train_size(self) -> int:
        """Rows drawn in one epoch: a finite domain (`train.epochs` counts them)."""
        return len(self._train)

    def heldout(self, n: int) -> list[Task]:
        if not self._heldout:
            raise UserError(f"domain {self.name} has no held-out rows to evaluate on: set "
                            f"{self._key('heldout_path')} or a larger heldout_percent")
        return self._heldout[:n]

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return self.verifier.score(tasks, responses)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "order": list(self._order), "cursor": self._cursor}

    def load_state_dict(self, state: dict) -> None:
        if state["order"] and sorted(state["order"]) != list(range(len(self._train))):
            raise UserError(f"domain {self.name}: the checkpoint was drawn from {len(state['order'])} training "
                            f"rows, the file now has {len(self._train)}; resume with the same data")
        self.epoch, self._order, self._cursor = state["epoch"], list(state["order"]), state["cursor"]

    # -- the sandbox (code verifier), as the `code` domain offers it to the Ray engine ------------

    def sandbox_config(self):
        return self.verifier.sandbox_config() if isinstance(self.verifier, RunsCode) else None

    def use_sandbox(self, backend) -> None:
        self.verifier.use_sandbox(backend)

    def close(self) -> None:
        self.verifier.close()


# ---------------------------------------------------------------------------- row helpers


def _column(row: dict[str, Any], column: str) -> Any:
    value = lookup(row, column)
    if value is None:
        raise RowError(column, "empty (null)")
    return value


def lookup(row: dict[str, Any], column: str) -> Any:
    """The value at `column`: a column's name, or a dotted path into nested objects (Parquet
    structs, JSON objects, `datasets` features), `reward_model.ground_truth`; a number indexes a
    list (`prompt.0.content`, or `prompt[0]`). A name that is itself a column wins over a path, so
    flattened columns (`a.b` written by pandas) still read. Raises RowError naming the missing part."""
    if column in row:
        return row[column]
    parts = re.findall(r"[^.\[\]]+", column)
    if len(parts) < 2:
        raise RowError(column, "missing")
    value: Any = row
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the row"
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict):
            raise RowError(column, f"{where} has no {part!r} (it has: {', '.join(map(str, value)) or 'nothing'})")
        elif isinstance(value, list):
            raise RowError(column, f"{where} is a list of {len(value)}; {part!r} is not an index in it")
        else:
            raise RowError(column, f"{where} is {type(value).__name__}, not an object with {part!r}")
    return value


def _text(row: dict[str, Any], column: str) -> str:
    value = _column(row, column)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RowError(column, f"expected text or a number, got {type(value).__name__}")
    return str(value)


def _format(template: str, row: dict[str, Any]) -> str:
    """`template` with each `{field}` replaced by the row's value at that column or dotted path
    (`{extra_info.question}`); conversions and format specs as str.format's (`{n!r}`, `{x:>4}`)."""
    out = []
    try:
        for literal, field, spec, conversion in string.Formatter().parse(template):
            out.append(literal)
            if field is None:
                continue
            if not field:
                raise ValueError("positional fields {} name no column")
            value = _column(row, field)
            value = {"r": repr, "s": str, "a": ascii}[conversion](value) if conversion else value
            out.append(format(value, spec or ""))
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise RowError("", f"prompt {template!r} cannot be formatted with this row ({type(e).__name__}: {e})") from None
    return "".join(out)


def _reference(text: str) -> str:
    """GSM8K's `reasoning #### 72` -> `72`; any other reference as it is."""
    if _GSM_FINAL in text:
        return text.rsplit(_GSM_FINAL, 1)[1].strip().replace(",", "")
    return text


def _level(row: dict[str, Any], column: str) -> int:
    value = _column(row, column)
    found = _LEVEL.search(str(value)) if not isinstance(value, bool) else None
    if found is None:
        raise RowError(column, f"expected an integer level, got {value!r}")
    return int(found.group())


def _split_key(task: Task) -> str:
    return task.prompt if len(task.messages or ()) <= 2 else json.dumps(task.messages)
