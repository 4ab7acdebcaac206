"""Math answers checked with math-verify, safely: in supervised worker processes, with a deadline.

    >>> with MathVerifier(timeout_s=5) as v:                       # doctest: +SKIP
    ...     [s.correct for s in v.verify([("\\\\frac{1}{2}", "so \\\\boxed{0.5}"), ("2", "\\\\boxed{3}")])]
    [True, False]

`gold` is the reference answer as written in the data set (`\\frac{1}{2}`, `[1,3)`, `50\\%`,
`\\{1,2\\}`, or already in `$...$` / `\\boxed{}`); `answer` is the model's whole completion, from
which math-verify extracts the final answer (`\\boxed{}` first, then the last LaTeX or plain
expression).

Verdicts: `ok` with correct True/False (reward 1/0, component `correct`); `timeout` when the
worker did not finish within `timeout_s`; `error` when the gold answer cannot be parsed or the
worker crashed. The last two carry correct=None and reward 0.0: the trainer must count them (they
are "could not verify", not "wrong"). Only `ok` verdicts are cached: a timeout under load says
nothing about the pair.

math-verify's own timeouts are switched off inside the workers (they turn a timeout into a
silent False); the pool's deadline replaces them. Nothing here ever calls str() on a parsed
sympy object (printing some of them hangs); logs and details carry the raw strings only.
"""

from __future__ import annotations

import atexit
import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from postrl.records import Score
from postrl.rewards.terms import register_term
from postrl.rewards.workers.pool import WorkerPool

_HANDLER = "postrl.rewards.math:verify_job"


class GoldUnparseable(ValueError):
    pass


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # cached per worker: a group's samples share one gold answer (sympy objects are immutable)
    from math_verify import parse

    # Bare LaTeX such as `[1,3)` or `x^2+1` is only recognised inside math delimiters.
    text = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
    parsed = parse(text, parsing_timeout=None) or parse(gold, parsing_timeout=None)
    if not parsed:
        raise GoldUnparseable(f"gold answer not parseable: {gold[:80]!r}")
    return tuple(parsed)


def verify_job(job: list) -> bool:
    """Worker-side handler: job = [gold, answer]; True when the answer matches the gold one."""
    from math_verify import parse, verify

    gold, answer = job
    parsed_gold = list(_parse_gold(gold))
    parsed_answer = parse(answer, parsing_timeout=None)
    if not parsed_answer:
        return False  # no answer could be extracted: wrong, not unverifiable
    return bool(verify(parsed_gold, parsed_answer, timeout_seconds=None))


def _widen_parse_caches(size: int) -> None:
    """math-verify memoises the parse of each extracted LaTeX/plain answer string, but only the
    last 20. A step's samples repeat a few answers in many different completions (and ANTLR
    parsing is most of a verification's cost), so each worker keeps `size`. Same functions,
    same keys: only the cache size changes, so verdicts cannot. Left alone if a math-verify
    version no longer has these memoised helpers."""
    import math_verify.parser as parser

    for name in ("parse_latex_cached", "parse_expr_cached"):
        fn = getattr(parser, name, None)
        if fn is not None and hasattr(fn, "cache_info") and hasattr(fn, "__wrapped__"):
            setattr(parser, name, functools.lru_cache(maxsize=size)(fn.__wrapped__))


def warmup(parse_cache: int = 0) -> None:
    """In the worker before it is confined: widen math-verify's parse caches to `parse_cache`
    entries (0: leave math-verify's), and import it and its LaTeX grammar."""
    if parse_cache:
        _widen_parse_caches(parse_cache)
    verify_job(["\\frac{1}{2}", "\\boxed{0.5}"])
    verify_job(["[1,3)", "$\\{1, 2\\}$ and x^2"])


def _score(status: str, value, detail: str) -> Score:
    if status == "ok":
        hit = bool(value)
        return Score(float(hit), hit, "ok", {"correct": float(hit)})
    return Score(0.0, None, status, {}, detail)


class MathVerifier:
    """Batched math verification over a `WorkerPool`, with an LRU cache of verdicts.

    Thread-safe: any number of threads may call `verify`/`score` at once.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        timeout_s: float = 5.0,
        cache_size: int = 100_000,
        parse_cache: int = 4096,
        memory_mb: int = 2048,
    ):
        """`cache_size` (gold, completion) verdicts are kept here; each worker keeps the parses of
        `parse_cache` extracted answers (0: math-verify's own 20)."""
        self._pool = WorkerPool(_HANDLER, workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                                options={"parse_cache": parse_cache})
        self._cache: OrderedDict[tuple[str, str], Score] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.cache_hits = 0

    @property
    def stats(self) -> dict:
        return {**self._pool.stats, "cache_hits": self.cache_hits, "isolation": self._pool.isolation}

    def verify(self, pairs: Sequence[tuple[str, str]]) -> list[Score]:
        """Score (gold, answer) pairs; duplicates and cached pairs are verified once."""
        pairs = [(str(g), str(a)) for g, a in pairs]
        known = self._lookup(pairs)
        todo = list(dict.fromkeys(p for p in pairs if p not in known))
        for pair, outcome in zip(todo, self._pool.map([list(p) for p in todo])):
            known[pair] = _score(outcome.status, outcome.value, outcome.detail)
        self._store({p: s for p, s in known.items() if s.status == "ok"})
        # fresh copies: callers (composite rewards) add components to what they get back
        return [replace(known[p], components=dict(known[p].components)) for p in pairs]

    def score(self, tasks, responses) -> list[Score]:
        """Domain-style batched grading: the gold answer is `task.answer`."""
        return self.verify([(t.answer, r.text) for t, r in zip(tasks, responses, strict=True)])

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _lookup(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Score]:
        found = {}
        with self._lock:
            for p in pairs:
                hit = self._cache.get(p)
                if hit is not None:
                    self._cache.move_to_end(p)
                    found[p] = hit
                    self.cache_hits += 1
        return found

    def _store(self, verdicts: dict[tuple[str, str], Score]) -> None:
        with self._lock:
            self._cache.update(verdicts)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide verifier used by the `math` reward term; closed at interpreter exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(close_default_verifier)
        return _default


def close_default_verifier() -> None:
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None


@register_term("math")
def math_term(tasks, responses) -> list[Score]:
    """math-verify verdict of each completion against `task.answer` (1/0; timeouts stay visible)."""
    return default_verifier().score(tasks, responses)
