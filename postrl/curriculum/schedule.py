"""Curriculum schedules: once per step `schedule.update(step, samples)` with every group drawn,
and between steps the schedule tells the sampler what to draw:

    tasks = sampler.next_batch(n, schedule.weights, schedule.task_weight)

A schedule owns the curriculum's state: the domain weights of the next draw (`weights`), and
whatever it keeps to decide them and each problem's keep-probability (`task_weight`). `fixed`
keeps the recipe's weights. `learnability` moves compute to what is learnable now (below).
Schedules are registered by name and carry their whole state in `state_dict()`, so a checkpoint
restores them exactly. A schedule whose state is per domain also `carry_over`s a checkpoint's state
to another set of domains (`CarriesOver`): a run resumed after a domain was added to its recipe or
taken out goes on with the state of the domains still trained.

## Why learnability, and which

A GRPO group teaches only through the spread of its rewards: with pass rate p over a group of
0/1 rewards the advantages' variance is p(1-p) (before std scaling), so a problem's expected
signal per group is proportional to p(1-p). That is zero for problems always or never solved,
largest at p = 1/2 -- the "frontier of learnability" (Foster & Foerster, 2025; DAPO's dynamic
sampling and many curricula use the same quantity).

A problem's p is not known, only its recent record: s successes in n attempts. We use the
*expected* p(1-p) under the posterior Beta(s+1, n-s+1) (uniform prior),

    E[p(1-p)] = a*b / ((a+b) * (a+b+1)),   a = s+1, b = n-s+1,

which is 1/6 for an unseen problem and falls towards 0 only as evidence accumulates: one 8/8
group halves a problem's weight, not zeroes it (a lucky group is not mastery). Divided by the
unseen value 1/6 and capped at 1, it is the probability `task_weight` keeps a drawn problem
(rejection sampling), floored at `min_problem_weight` so that mastered problems still come back
now and then. Unseen problems are always kept: new problems are the cheapest exploration, and
generated domains are almost all unseen problems, for which the family grain below matters.

Problems never solved after `park_after_attempts` attempts are *parked* (weight 0) and re-probed
every `reprobe_every_steps` steps; a success unparks them.

Domains: weight_d = floor + (1 - D*floor) * w0_d*L_d / sum_e w0_e*L_e, with L_d the mean p(1-p)
of the domain's recent groups (the signal its prompts actually carried), w0 the recipe's weights
and D the number of domains; a domain without data yet counts as L = 1/4 (maximally learnable).
The floor means no domain starves, so a domain that becomes learnable again is noticed.

Levels (generated domains with several) are families with the same rule: a problem's keep
probability is also multiplied by its level's E[p(1-p)] (rolling, per domain and level) over the
best unlocked level's. Levels unlock as they are mastered: the *frontier* is the easiest level
whose rolling pass rate has not reached `mastery_pass_rate` over `level_min_groups` groups;
every level up to one above the frontier is drawn, higher ones not yet. (A first version
drew only the frontier level; on the multi-domain benchmark it held `code` at level 1, which
never reached mastery, while uniform sampling improved levels 2-3: hard gating starves
learnable levels, so levels above are weighed, not gated, one level ahead.) Mastered levels keep
a small weight, which doubles as review against forgetting.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from postrl.config.schema import CurriculumConfig
from postrl.curriculum.tracker import PassRates, family_domain, group_outcomes
from postrl.records import Sample, Task
from postrl.registry import Registry

SCHEDULES = Registry("curriculum schedule", key="curriculum.schedule")
UNSEEN_LEARNABILITY = 1 / 6
"""E[p(1-p)] under the uniform prior: the value a problem with no record has."""


register_schedule = SCHEDULES.register


def make_schedule(settings: CurriculumConfig, weights: dict[str, float], levels: dict[str, list[int]]):
    """The configured schedule, starting from the recipe's domain weights; `levels` are each
    domain's difficulty levels, easiest first."""
    return SCHEDULES.get(settings.schedule)(weights, levels=levels, settings=settings)


@runtime_checkable
class CarriesOver(Protocol):
    """A schedule whose state is kept per domain. `carry_over(state)` makes a checkpoint's state,
    written when the run trained other domains, into one for this schedule's domains (the recipe's
    now), for `load_state_dict`: a domain still trained keeps its state, a new one starts as at a
    run's start, a dropped one's is gone. It reads only what the schedule was built with, not its
    state, and changes nothing. A schedule without it cannot resume with other domains."""

    def carry_over(self, state: dict) -> dict: ...


@register_schedule("fixed")
class FixedSchedule:
    """The recipe's domain weights, every problem and level of each domain kept as drawn."""

    def __init__(self, weights: dict[str, float], **_):
        self.recipe = dict(weights)
        self.weights = dict(weights)

    def update(self, step: int, samples: list) -> None:
        pass

    def task_weight(self, task: Task) -> float:
        return 1.0

    def metrics(self) -> dict[str, float]:
        return weight_metrics(self.weights)

    def state_dict(self) -> dict:
        return {"weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.weights = dict(state["weights"])

    def carry_over(self, state: dict) -> dict:
        """The checkpoint's weight of a domain still trained, the recipe's of a new one."""
        return {"weights": {d: state["weights"].get(d, w) for d, w in self.recipe.items()}}


def weight_metrics(weights: dict[str, float]) -> dict[str, float]:
    """`curriculum/weight/NAME`: each domain's share of the next draw."""
    total = sum(weights.values())
    return {f"curriculum/weight/{name}": w / total for name, w in weights.items()}


def expected_learnability(attempts: int, successes: int) -> float:
    """E[p(1-p)] for p ~ Beta(successes+1, failures+1). E.g. (0, 0) -> 1/6, (8, 8) -> 9/110."""
    a, b = successes + 1, attempts - successes + 1
    return a * b / ((a + b) * (a + b + 1))


def domain_shares(base: dict[str, float], learnability: dict[str, float], floor: float) -> dict[str, float]:
    """floor + (1 - D*floor) * base*L / sum(base*L); the recipe's own shares when no domain has signal."""
    raw = {d: base[d] * learnability[d] for d in base}
    total = sum(raw.values())
    if total <= 0:
        raw, total = dict(base), sum(base.values())
    free = 1.0 - floor * len(base)
    return {d: floor + free * raw[d] / total for d in base}


@register_schedule("learnability")
class LearnabilitySchedule:
    def __init__(self, weights: dict[str, float], levels: dict[str, list[int]], settings: CurriculumConfig):
        self.base = dict(weights)
        self.weights = dict(weights)
        """Domain weights of the next draw: the recipe's until the first update."""
        self.domain_levels = {d: sorted(lv) for d, lv in levels.items()}
        self.s = settings
        self.rates = PassRates(settings.window_groups, settings.problem_window_groups, settings.max_tracked_problems)
        self.level_index = {d: 0 for d in self._multi_level()}
        self.parked: dict[str, int] = {}  # task id -> step it was (re-)parked at
        self.step = 0  # the step the sampler is drawing for

    def update(self, step: int, samples: list[Sample]) -> None:
        outcomes = group_outcomes(samples)
        self.rates.record(outcomes)
        for o in outcomes:
            self._park_or_release(o.task_id, step)
        for domain in self.level_index:
            self._maybe_level_up(domain)
        self.step = step + 1
        self.weights = domain_shares(self.base, self._learnability(), self.s.domain_floor)

    def _park_or_release(self, task_id: str, step: int) -> None:
        attempts, successes = self.rates.problem(task_id)
        if successes:
            self.parked.pop(task_id, None)
        elif attempts >= self.s.park_after_attempts:
            self.parked[task_id] = step  # a failed re-probe parks it again from now
        if len(self.parked) > self.s.max_tracked_problems:
            del self.parked[min(self.parked, key=self.parked.get)]

    def _maybe_level_up(self, domain: str) -> None:
        levels, i = self.domain_levels[domain], self.level_index[domain]
        groups, attempts, successes = self.rates.family(domain, levels[i])
        mastered = groups >= self.s.level_min_groups and successes >= self.s.mastery_pass_rate * attempts
        if mastered and i + 1 < len(levels):
            self.level_index[domain] = i + 1

    def _multi_level(self) -> list[str]:
        return [d for d, lv in self.domain_levels.items() if len(lv) > 1]

    def _learnability(self) -> dict[str, float]:
        return domain_learnability(self.rates, self.base)

    def frontier(self) -> dict[str, int]:
        """Each multi-level domain's easiest level not yet mastered (its top level once all are)."""
        return {d: self.domain_levels[d][i] for d, i in self.level_index.items()}

    def task_weight(self, task: Task) -> float:
        """Probability that the sampler keeps `task` when it draws it."""
        parked_at = self.parked.get(task.task_id)
        if parked_at is not None:
            return 1.0 if self.step - parked_at >= self.s.reprobe_every_steps else 0.0
        level_keep = self._level_keep(task)
        if level_keep == 0.0:
            return 0.0
        attempts, successes = self.rates.problem(task.task_id)
        keep = 1.0 if attempts == 0 else expected_learnability(attempts, successes) / UNSEEN_LEARNABILITY
        keep = min(1.0, keep) * level_keep
        return keep if keep >= 1.0 else max(self.s.min_problem_weight, keep)

    def _level_keep(self, task: Task) -> float:
        """0 above the unlocked levels, else the level's E[p(1-p)] over the best unlocked level's."""
        if task.domain not in self.level_index:
            return 1.0
        unlocked = self.domain_levels[task.domain][: self.level_index[task.domain] + 2]
        if task.level not in unlocked:
            return 0.0
        learn = {lv: expected_learnability(*self.rates.family(task.domain, lv)[1:]) for lv in unlocked}
        return learn[task.level] / max(learn.values())

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = weight_metrics(self.weights) | {"curriculum/parked": float(len(self.parked))}
        learn = self._learnability()
        for d in self.base:
            m[f"curriculum/learnability/{d}"] = learn[d]
            rate = self.rates.domain_pass_rate(d)
            if rate is not None:
                m[f"curriculum/pass_rate/{d}"] = rate
        for d, level in self.frontier().items():
            m[f"curriculum/level/{d}"] = float(level)
        return m

    def state_dict(self) -> dict:
        return {"rates": self.rates.state_dict(), "level_index": dict(self.level_index),
                "parked": dict(self.parked), "step": self.step, "weights": dict(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        self.rates.load_state_dict(state["rates"])
        self.level_index = dict(state["level_index"])
        self.parked = dict(state["parked"])
        self.step = state["step"]
        self.weights = dict(state["weights"])

    def carry_over(self, state: dict) -> dict:
        """A domain still trained keeps its rolling records and level; a new one has none (learnability
        1/4, as every domain at a run's start) and starts at its easiest level; a dropped one's records
        go. The weights are worked out again from the recipe's and the records kept (`domain_shares`,
        as `update` does: the floor depends on the number of domains). Problem records and parked
        problems are by task id and stay: a dropped domain's are never drawn again and age out."""
        old = state["rates"]
        rates = {"problems": old["problems"],
                 "families": {k: v for k, v in old["families"].items() if family_domain(k) in self.base},
                 "domains": {k: v for k, v in old["domains"].items() if k in self.base}}
        carried = PassRates(self.s.window_groups, self.s.problem_window_groups, self.s.max_tracked_problems)
        carried.load_state_dict(rates)
        weights = domain_shares(self.base, domain_learnability(carried, self.base), self.s.domain_floor)
        return {"rates": rates, "level_index": {d: state["level_index"].get(d, 0) for d in self._multi_level()},
                "parked": dict(state["parked"]), "step": state["step"], "weights": weights}


def domain_learnability(rates: PassRates, domains) -> dict[str, float]:
    """Each domain's mean p(1-p) over its recent groups; 1/4 (maximally learnable) for one without data yet."""
    out = {}
    for d in domains:
        value = rates.domain_learnability(d)
        out[d] = 0.25 if value is None else value
    return out
