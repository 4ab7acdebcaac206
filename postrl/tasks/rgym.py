"""reasoning-gym datasets as postrl domains: every dataset `X` is the domain `rg:X`.

    domains:
      "rg:gsm_symbolic":   {weight: 1.0}
      "rg:basic_arithmetic":
        params: {levels: [0, 1, 2], partial_credit: false, config: {min_terms: 2}}

Params (all optional):
  config          dataset config fields (reasoning-gym's `<Dataset>Config`), applied at every level
  levels          which curriculum levels to expose (default: all the dataset's curriculum has;
                  [0] for datasets without one). Level L is reasoning-gym's curriculum at global
                  level L in its default "inclusive" mode, i.e. problems up to that difficulty.
  partial_credit  false (default): reward 1 only when reasoning-gym scores the answer 1.0, else 0.
                  reasoning-gym's own scores give partial credit (gold "-4" scores "--4" at 0.667),
                  which teaches near-misses; true uses its score as the reward.
  answer          how the answer is taken from the completion: "auto" (default: the last
                  <answer>...</answer> if present, else the whole completion), "tag" or "raw".
  prompt_template format string with {question} (default "{question}")
  heldout_size    size of the fixed held-out pool (default 200)
  isolate         score in confined worker processes: null (default: only datasets that eval
                  the answer), true (all) or false (none; refused for the eval ones)
  timeout_s       per-answer scoring deadline in the workers (default 10)

Held-out split: training and held-out problems are generated from different seeds, and training
draws skip any problem whose question is in the held-out pool (so even datasets with a small
problem space never leak held-out questions into training).

Isolation: countdown, puzzle24, simple/intermediate_integration, polynomial_multiplication,
string_insertion, spiral_matrix, binary_matrix and n_queens call `eval` (directly or through
sympy) on the model's answer. Their scoring runs in `postrl.rewards.workers.pool` workers confined by
`postrl.rewards.workers.confine` (no writes, exec, network; memory cap; deadline), never in the trainer's
process. A worker receives the dataset config, the item index and the answer, and rebuilds the
item itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards.format import tagged_answer
from postrl.rewards.rgym_scorer import isolated_pool
from postrl.tasks.base import register_domain

EVAL_SCORED = frozenset({
    "countdown", "puzzle24", "simple_integration", "intermediate_integration",
    "polynomial_multiplication", "string_insertion", "spiral_matrix", "binary_matrix", "n_queens",
})
"""Datasets whose score_answer evals the answer; `composite` may contain them."""
_ALWAYS_ISOLATED = EVAL_SCORED | {"composite"}

# The datasets of reasoning-gym 0.1.x, listed here so that registering the domains does not cost
# importing reasoning-gym (over a second) at every `import postrl.tasks`; a test checks the list
# against the installed version.
RG_DATASETS = (
    "ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf "
    "binary_alternation binary_matrix bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic "
    "chain_sum circuit_logic codeio coin_flip color_cube_rotation complex_arithmetic composite "
    "count_bits count_primes countdown course_schedule cryptarithm decimal_arithmetic "
    "decimal_chain_sum dice emoji_mystery family_relationships figlet_font fraction_simplification "
    "futoshiki game_of_life game_of_life_halting gcd graph_color group_anagrams gsm_symbolic "
    "intermediate_integration isomorphic_strings jugs kakurasu knight_swap knights_knaves "
    "largest_island lcm leg_counting letter_counting letter_jumble list_functions mahjong_puzzle "
    "manipulate_matrix maze mini_sudoku modulo_grid n_queens needle_haystack number_filtering "
    "number_format number_sequence number_sorting palindrome_generation palindrome_partitioning "
    "path_star polynomial_equations polynomial_multiplication pool_matrix power_function "
    "prime_factorization products propositional_logic puzzle24 quantum_lock ransom_note rearc "
    "rectangle_count rotate_matrix rotten_oranges rubiks_cube rush_hour self_reference "
    "sentence_reordering shortest_path simple_equations simple_geometry simple_integration sokoban "
    "spell_backward spiral_matrix string_insertion string_manipulation string_splitting "
    "string_synthesis sudoku survo syllogism time_intervals tower_of_hanoi tsumego word_ladder "
    "word_sequence_reversal word_sorting zebra_puzzles"
).split()

_DATASET_SIZE = 1_000_000  # virtual size: items are generated on demand from (seed, index)
_MAX_REDRAWS = 200


def _extract(text: str, mode: str) -> str:
    return {
        "raw": lambda: text.strip(),
        "tag": lambda: tagged_answer(text) or "",
        "auto": lambda: tagged_answer(text) if tagged_answer(text) is not None else text.strip(),
    }[mode]()


def _seed(*parts: Any) -> int:
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16)


class ReasoningGymDomain:
    reward_components = ("correct", "rg_score")

    def __init__(self, dataset: str, params: dict, seed: int, name: str = ""):
        import reasoning_gym  # noqa: F401  (fills reasoning_gym.factory's registries)
        from reasoning_gym.factory import DATASETS

        if dataset not in DATASETS:
            raise UserError(f"unknown reasoning-gym dataset '{dataset}'")
        params = dict(params)
        self.dataset = dataset
        self.name = name or f"rg:{dataset}"
        self.seed = seed
        self._cls, self._config_cls = DATASETS[dataset]
        self.partial_credit = bool(params.pop("partial_credit", False))
        self.answer_mode = params.pop("answer", "auto")
        self.template = params.pop("prompt_template", "{question}")
        self.heldout_size = int(params.pop("heldout_size", 200))
        self.timeout_s = float(params.pop("timeout_s", 10.0))
        self.isolate = self._isolation(params.pop("isolate", None))
        user_config = dict(params.pop("config", {}))
        all_levels = self._curriculum_levels()
        self.levels = [int(x) for x in params.pop("levels", all_levels)]
        if params:
            raise UserError(f"{self.name}: unknown params {', '.join(sorted(params))}; valid: config, "
                            "levels, partial_credit, answer, prompt_template, heldout_size, isolate, timeout_s")
        if self.answer_mode not in ("auto", "tag", "raw"):
            raise UserError(f"{self.name}: answer must be auto, tag or raw, not {self.answer_mode!r}")
        if not self.levels or any(lv not in all_levels for lv in self.levels):
            raise UserError(f"{self.name}: levels must be a non-empty subset of {all_levels}")
        self._configs = {lv: self._level_config(lv, user_config) for lv in self.levels}
        self._train = {lv: self._make(lv, "train") for lv in self.levels}
        self._heldout_ds = {lv: self._make(lv, "heldout") for lv in self.levels}
        self._heldout_tasks: list[Task] = []
        self._heldout_questions: set[str] = set()
        self._extend_heldout(self.heldout_size)

    # -- problems ------------------------------------------------------------------------------

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        lv = rng.choice(self.levels) if level is None else level
        if lv not in self._train:
            raise ValueError(f"{self.name}: no level {lv}; levels are {self.levels}")
        ds = self._train[lv]
        for _ in range(_MAX_REDRAWS):
            idx = rng.randrange(_DATASET_SIZE)
            task = self._task(ds, idx, lv)
            if task.prompt not in self._heldout_questions:
                return task
        raise UserError(f"{self.name} level {lv}: every draw hit the held-out pool; the problem space "
                        "is too small for heldout_size")

    def heldout(self, n: int) -> list[Task]:
        if n > len(self._heldout_tasks):
            self._extend_heldout(n)
        return self._heldout_tasks[:n]

    def _extend_heldout(self, n: int) -> None:
        # round-robin over levels; questions are unique within the pool
        i = len(self._heldout_tasks)
        while len(self._heldout_tasks) < n:
            lv = self.levels[i % len(self.levels)]
            task = self._task(self._heldout_ds[lv], i, lv)
            if task.prompt not in self._heldout_questions:
                self._heldout_questions.add(task.prompt)
                self._heldout_tasks.append(task)
            i += 1
            if i > 50 * n + 100:
                raise UserError(f"{self.name}: could not find {n} distinct held-out problems")

    def _task(self, ds, idx: int, level: int) -> Task:
        entry = ds[idx]
        prompt = self.template.format(question=entry["question"])
        config = dataclasses.asdict(ds.config)
        return Task(
            domain=self.name,
            task_id=f"{self.name}/{hashlib.sha256(prompt.encode()).hexdigest()[:16]}",
            prompt=prompt,
            answer="" if entry.get("answer") is None else str(entry["answer"]),
            level=level,
            meta={"entry": entry, "index": idx, "config": config},
        )

    def _make(self, level: int, split: str):
        cfg = dataclasses.replace(self._configs[level], seed=_seed(self.seed, self.dataset, level, split),
                                  size=_DATASET_SIZE)
        return self._cls(config=cfg)

    def _curriculum_levels(self) -> list[int]:
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if not has_curriculum(self.dataset):
            return [0]
        attrs = create_curriculum(self.dataset).attributes.values()
        return list(range(max((len(a.levels) for a in attrs), default=1)))

    def _level_config(self, level: int, user_config: dict):
        from reasoning_gym.factory import create_curriculum, has_curriculum

        try:
            if not has_curriculum(self.dataset):
                cfg = self._config_cls(**user_config)
            else:
                cur = create_curriculum(self.dataset)
                cur.set_global_level(level)
                cfg = cur.generate_configuration(defaults=user_config)
            if hasattr(cfg, "validate"):
                cfg.validate()
        except (TypeError, ValueError, AssertionError) as e:
            raise UserError(f"{self.name}: bad config {user_config}: {e}") from None
        return cfg

    def _isolation(self, isolate) -> bool:
        if isolate is False and self.dataset in _ALWAYS_ISOLATED:
            raise UserError(f"{self.name}: scoring evals the answer, so isolate cannot be false")
        return self.dataset in _ALWAYS_ISOLATED if isolate is None else bool(isolate)

    # -- grading -------------------------------------------------------------------------------

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        answers = [_extract(r.text, self.answer_mode) for r in responses]
        if self.isolate:
            jobs = [{"dataset": self.dataset, "config": t.meta["config"], "index": t.meta["index"],
                     "answer": a} for t, a in zip(tasks, answers, strict=True)]
            outcomes = isolated_pool(self.timeout_s).map(jobs)
            return [self._verdict(o.status, o.value, o.detail) for o in outcomes]
        return [self._score_here(t, a) for t, a in zip(tasks, answers, strict=True)]

    def _score_here(self, task: Task, answer: str) -> Score:
        try:
            ds = self._train.get(task.level) or self._make(self.levels[0], "train")
            return self._verdict("ok", float(ds.score_answer(answer, task.meta["entry"])), "")
        except Exception as e:  # noqa: BLE001 - a scorer bug is "could not verify", never a verdict
            return self._verdict("error", None, f"{type(e).__name__} in score_answer")

    def _verdict(self, status: str, value, detail: str) -> Score:
        if status != "ok":
            return Score(0.0, None, status, {}, detail)
        raw = float(value)
        correct = raw == 1.0
        reward = raw if self.partial_credit else float(correct)
        return Score(reward, correct, "ok", {"correct": float(correct), "rg_score": raw})

    def close(self) -> None:
        """Nothing per domain: the isolation pools are shared (`postrl.rewards.rgym_scorer`)."""


def _factory(dataset: str):
    def make(params: dict, seed: int, name: str = "") -> ReasoningGymDomain:
        return ReasoningGymDomain(dataset, params, seed, name)

    return make


for _name in RG_DATASETS:
    register_domain(f"rg:{_name}", components=ReasoningGymDomain.reward_components)(_factory(_name))
