"""The `code` domain: sampling, held-out splits, params validation, and scoring through the
sandbox with reward components."""

from __future__ import annotations

import random

import pytest

from postrl.errors import UserError
from postrl.records import Response
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, SandboxConfig, SandboxUnavailable
from postrl.tasks.catalog import make_domain
from postrl.tasks.code import ALPHABET


@pytest.fixture(scope="module", autouse=True)
def needs_sandbox():
    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def gen():
    d = make_domain("code", {"source": "generated", "levels": [1, 2, 3, 4], "workers": 2}, seed=0)
    yield d
    d.close()


def test_params_are_validated():
    with pytest.raises(UserError, match="domains.code.params.sourse"):
        make_domain("code", {"sourse": "humaneval"})
    with pytest.raises(UserError, match="source"):
        make_domain("code", {"source": "mbpp"})
    with pytest.raises(UserError, match="levels"):
        make_domain("code", {"levels": [7]})


def test_generated_heldout_is_fixed_and_disjoint(gen):
    held = gen.heldout(40)
    assert len(held) == 40 and len({t.task_id for t in held}) == 40
    again = make_domain("code", {"source": "generated", "levels": [1, 2, 3, 4]}, seed=99).heldout(40)
    assert [t.task_id for t in again] == [t.task_id for t in held]
    rng = random.Random(1)
    train = {gen.sample(rng).task_id for _ in range(2000)}
    assert not train & {t.task_id for t in held}
    assert {gen.sample(rng, level=lv).level for lv in (1, 2, 3, 4)} == {1, 2, 3, 4}
    for t in held + [gen.sample(rng) for _ in range(50)]:
        assert set(t.prompt + t.meta["canonical"]) <= set(ALPHABET)
        assert t.answer == "f" and t.prompt.endswith("return ")


def test_generated_scoring(gen):
    rng = random.Random(3)
    tasks = [gen.sample(rng) for _ in range(4)]
    good = gen.score(tasks, [Response(t.meta["canonical"] + "\n# trailing junk", "stop") for t in tasks])
    assert [s.reward for s in good] == [1.0] * 4 and all(s.correct for s in good)
    assert good[0].components["compiles"] == 1.0 and good[0].components["tests"] == 1.0
    assert "tests=111" in good[0].detail and "isolation=bwrap" in good[0].detail
    wrong = gen.score(tasks[:1], [Response("x*1000", "stop")])[0]
    assert wrong.correct is False and wrong.reward == pytest.approx(0.2) and wrong.status == "ok"
    broken = gen.score(tasks[:1], [Response("x +* 2", "length")])[0]
    assert broken.reward == 0.0 and broken.components["compiles"] == 0.0
    slow = gen.score(tasks[:1], [Response("next(v for v in iter(int, 1) if v)", "stop")])[0]
    assert slow.components["penalty_timeout"] == 1.0 and slow.reward == pytest.approx(0.2 - 0.1)


def test_scores_on_a_backend_it_is_given():
    """engine: ray hands the domain the sandbox actor's backend: every run goes there, none to a
    pool of the domain's own."""
    d = make_domain("code", {"source": "generated", "workers": 1}, seed=0)
    calls = []
    with SandboxPool(SandboxConfig(workers=1)) as pool:

        class Counting:
            preloaded, n_workers = pool.preloaded, 1

            def run_many(self, reqs):
                calls.append(len(reqs))
                return pool.run_many(reqs)

        backend = Counting()
        d.use_sandbox(backend)
        task = d.sample(random.Random(3))
        [score] = d.score([task], [Response(task.meta["canonical"] + "\n", "stop")])
        assert score.correct and calls == [1, 1]  # the candidate's run, then the judge's
        assert d.judge().backend is backend
        d.close()  # not the domain's to stop
        assert pool.run_many([RunRequest("print(1)")])[0].stdout.strip() == "1"


def test_humaneval_source():
    d = make_domain("code", {"source": "humaneval", "workers": 2, "penalty_timeout": 0.5}, seed=0)
    try:
        held = d.heldout(100)
        assert len(held) == 33 and held[0].task_id == "HumanEval/0"
        rng = random.Random(0)
        train = {d.sample(rng).task_id for _ in range(3000)}
        assert len(train) == 131 and not train & {t.task_id for t in held}
        tasks = held[:3]
        # model-style completion: body, then more code the stop sequences cut off
        texts = [t.meta["canonical"] + "\n\ndef main():\n    print(1)\n" for t in tasks]
        scores = d.score(tasks, [Response(x, "stop") for x in texts])
        assert [s.reward for s in scores] == [1.0, 1.0, 1.0]
        bad = d.score(tasks, [Response("    return None\n", "stop")] * 3)
        assert all(s.reward == pytest.approx(0.2) and s.correct is False for s in bad)
    finally:
        d.close()
