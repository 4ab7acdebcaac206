"""Rolling pass rates from the training rollouts themselves, at three grains:

    problem  task id                       ("arith/47+38=", "HumanEval/12")
    family   domain and difficulty level   ("arith/L2"): the grain that matters for generated
             domains, whose problems rarely recur
    domain   domain name                   ("arith")

Every grain keeps the outcomes of its last few *groups* (one group = the samples of one prompt in
one step), so a rate reflects the current policy, not its whole history. A group's outcome is
(attempts, successes); "success" is the verifier's `correct`, as in the loop's `pass_rate`
metric (unverified counts as not passed).

The state is plain lists and dicts of numbers, so it goes into checkpoints as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from postrl.records import Sample


@dataclass(frozen=True)
class GroupOutcome:
    domain: str
    task_id: str
    level: int
    attempts: int
    successes: int

    @property
    def family(self) -> str:
        return family_key(self.domain, self.level)

    @property
    def pass_rate(self) -> float:
        return self.successes / self.attempts


def family_key(domain: str, level: int) -> str:
    return f"{domain}/L{level}"


def family_domain(key: str) -> str:
    """The domain of a `family_key`: "arith/L2" -> "arith"."""
    return key.rpartition("/L")[0]


def group_outcomes(samples: Sequence[Sample]) -> list[GroupOutcome]:
    """One outcome per group (samples sharing `group`), in order of first appearance."""
    by_group: dict[int, list[Sample]] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s)
    out = []
    for group in by_group.values():
        task = group[0].task
        wins = sum(bool(s.score is not None and s.score.correct) for s in group)
        out.append(GroupOutcome(task.domain, task.task_id, task.level, len(group), wins))
    return out


class PassRates:
    """Rolling (attempts, successes) per problem, family and domain."""

    def __init__(self, window_groups: int = 64, problem_window_groups: int = 8, max_problems: int = 50_000):
        self.window_groups = window_groups
        self.problem_window_groups = problem_window_groups
        self.max_problems = max_problems
        # key -> [[attempts, successes], ...] oldest first; problems in least-recently-seen order
        self.problems: dict[str, list[list[int]]] = {}
        self.families: dict[str, list[list[int]]] = {}
        self.domains: dict[str, list[list[int]]] = {}

    def record(self, outcomes: Iterable[GroupOutcome]) -> None:
        for o in outcomes:
            pair = [o.attempts, o.successes]
            history = self.problems.pop(o.task_id, [])  # re-inserted last: most recently seen
            self.problems[o.task_id] = (history + [pair])[-self.problem_window_groups :]
            for table, key in ((self.families, o.family), (self.domains, o.domain)):
                table[key] = (table.get(key, []) + [pair])[-self.window_groups :]
        while len(self.problems) > self.max_problems:  # bound memory: forget the longest-unseen
            del self.problems[next(iter(self.problems))]

    def problem(self, task_id: str) -> tuple[int, int]:
        """(attempts, successes) of a problem over its window; (0, 0) if unseen or forgotten."""
        return _totals(self.problems.get(task_id, []))

    def family(self, domain: str, level: int) -> tuple[int, int, int]:
        """(groups, attempts, successes) of a domain's level over the window."""
        history = self.families.get(family_key(domain, level), [])
        return (len(history), *_totals(history))

    def domain_pass_rate(self, domain: str) -> float | None:
        attempts, successes = _totals(self.domains.get(domain, []))
        return successes / attempts if attempts else None

    def domain_learnability(self, domain: str) -> float | None:
        """Mean over the window's groups of p(1-p), p = the group's pass rate: the reward variance
        a group hands GRPO, i.e. how much signal this domain's prompts currently carry."""
        history = self.domains.get(domain, [])
        if not history:
            return None
        return sum((s / n) * (1 - s / n) for n, s in history) / len(history)

    def state_dict(self) -> dict:
        return {"problems": list(self.problems.items()), "families": self.families, "domains": self.domains}

    def load_state_dict(self, state: dict) -> None:
        self.problems = {k: [list(p) for p in v] for k, v in state["problems"]}
        self.families = {k: [list(p) for p in v] for k, v in state["families"].items()}
        self.domains = {k: [list(p) for p in v] for k, v in state["domains"].items()}


def _totals(history: list[list[int]]) -> tuple[int, int]:
    return sum(n for n, _ in history), sum(s for _, s in history)
