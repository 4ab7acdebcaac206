"""Held-out evaluation (postrl.evaluation): the single-turn domains are sampled in one batch, each
with its own token limit and stop strings, and each domain's greedy verdicts are those of
evaluating it alone."""

import pytest

from postrl.builtin_models import load_model
from postrl.evaluation import count_correct, evaluate, evaluate_domain, grade_heldout
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import make_domain


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir), "float32", log=lambda *a: None)


def test_domains_are_sampled_in_one_call_with_their_own_limits_and_greedy_as_alone(tiny):
    model, tok = tiny
    policy = Policy(model, tok)
    calls = []
    inner = policy.backend.generate
    policy.backend.generate = lambda prompts, p, *a, **k: calls.append(p) or inner(prompts, p, *a, **k)
    domains = {name: make_domain(name, {}, 0) for name in ("arith", "sort", "mul")}
    limits = {"arith": (6, ()), "sort": (12, (" ",))}  # mul: the call's max_new_tokens
    kw = dict(num_problems=5, ks=[1, 2], samples_per_problem=3, temperature=1.0, max_new_tokens=9, seed=0)
    got = evaluate(policy, domains, limits, **kw)
    assert list(got) == list(domains) and len(calls) == 1 and len(calls[0]) == 3 * 5 * (1 + 3)
    by_domain = [calls[0][i * 20 : (i + 1) * 20] for i in range(3)]
    assert {p.max_new_tokens for p in by_domain[0]} == {6} and {p.stop_strings for p in by_domain[1]} == {(" ",)}
    assert {p.max_new_tokens for p in by_domain[2]} == {9}
    assert [sum(p.greedy for p in part) for part in by_domain] == [5, 5, 5]
    for name, d in domains.items():
        alone = evaluate_domain(policy, d, **(kw | dict(zip(("max_new_tokens", "stop"), limits.get(name, (9, ()))))))
        assert got[name]["greedy"] == alone["greedy"]  # greedy replies do not depend on the batch
        assert got[name]["n_problems"] == 5 and got[name]["samples_per_problem"] == 3
        assert got[name]["n_scored"] == 15 and 0 <= got[name]["pass@1"] <= got[name]["pass@2"] <= 1
    again = evaluate(policy, domains, limits, **kw)
    assert again == got  # one seeded generator: the same draws every time


def test_without_the_greedy_pass_the_samples_are_the_same_and_no_greedy_reply_is_made(tiny):
    """What a benchmark reading pass@k alone saves (benchmarks/_gain.measure(greedy=False)): the
    samples draw from their own seeded generator, so skipping the greedy pass changes none of them."""
    model, tok = tiny
    policy = Policy(model, tok)
    calls = []
    inner = policy.backend.generate
    policy.backend.generate = lambda prompts, p, *a, **k: calls.append(p) or inner(prompts, p, *a, **k)
    domain = make_domain("arith", {}, 0)
    tasks = domain.heldout(5)
    greedy_ok, sampled, scores = grade_heldout(policy, domain, tasks, 3, 1.0, 9, seed=0)
    made = len(calls)
    none, again, again_scores = grade_heldout(policy, domain, tasks, 3, 1.0, 9, seed=0, greedy=False)
    assert len(greedy_ok) == 5 and none == []
    assert [s.completion_ids for s in again] == [s.completion_ids for s in sampled] and again_scores == scores
    assert len({tuple(s.completion_ids) for s in again}) > 1  # sampled, not one reply fifteen times
    greedy = [any(g.greedy for g in (c if isinstance(c, list) else [c])) for c in calls]  # a call's params, or each row's
    assert any(greedy[:made]) and not any(greedy[made:])
    assert count_correct(policy, domain, tasks, 3, 1.0, 9, seed=0, greedy=False)[0] == []
