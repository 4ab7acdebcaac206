"""The sampling-backend seam (postrl.sampling.backends): the registry and its Protocol, the
Policy sampling through the backend `rollout.backend` names, and weights loaded once per
policy version. tests/toy_backend.py is the second backend: postrl's engine made greedy."""

from __future__ import annotations

import pytest
import torch
import toy_backend
from test_async import rows, run_train

from postrl.builtin_models import load_model
from postrl.config.schema import RolloutConfig
from postrl.errors import ConfigError
from postrl.records import Task
from postrl.sampling.backends import SAMPLING_BACKENDS, PostrlBackend, SamplingBackend, make_backend
from postrl.sampling.generate import GenParams, generate
from postrl.sampling.policy import Policy

TASKS = [Task("arith", f"t{i}", f"{i}+{i + 3}=", str(2 * i + 3)) for i in range(4)]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir), "float32", log=lambda *a: None)


def groups(completions: list[list[int]], n: int) -> list[list[list[int]]]:
    return [completions[g * n : (g + 1) * n] for g in range(len(completions) // n)]


def test_postrl_is_the_registered_default_and_a_sampling_backend(tiny):
    model, tok = tiny
    assert "postrl" in SAMPLING_BACKENDS and SAMPLING_BACKENDS.key == "rollout.backend"
    assert Policy(model, tok).rollout.backend == "postrl"
    backend = make_backend(RolloutConfig(), model, tok)
    assert isinstance(backend, PostrlBackend) and isinstance(backend, SamplingBackend)
    assert not isinstance(object(), SamplingBackend)


def test_the_postrl_backend_is_the_batched_engine(tiny):
    """Token in, token out: the same generations as `generate` on the same model and draws."""
    model, tok = tiny
    prompts = [tok(t.prompt)["input_ids"] for t in TASKS] * 3
    params = GenParams(8, stop_strings=("=",))
    got = PostrlBackend(model, tok, RolloutConfig()).generate(prompts, params, torch.Generator().manual_seed(3))
    want = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(3),
                    decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    assert [(g.token_ids, g.logprobs, g.finish_reason) for g in got] == \
        [(g.token_ids, g.logprobs, g.finish_reason) for g in want]


def test_an_unknown_backend_and_a_factory_that_builds_no_backend_are_config_errors(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"^config key 'rollout.backend' = 'vlm': unknown sampling backend"):
        Policy(model, tok, rollout=RolloutConfig(backend="vlm"))
    SAMPLING_BACKENDS.add("test_not_a_backend", lambda model, tok, cfg: object())
    try:
        policy = Policy(model, tok, rollout=RolloutConfig(backend="test_not_a_backend"))  # built on first use
        with pytest.raises(ConfigError, match="'test_not_a_backend': object is not a sampling backend"):
            policy.sample(TASKS, 2, GenParams(4), torch.Generator().manual_seed(0))
    finally:
        SAMPLING_BACKENDS.remove("test_not_a_backend")


def test_the_policy_samples_through_the_backend_it_names(tiny):
    """The toy backend's samples are greedy (every group's completions equal) where postrl's at
    temperature 1 are not; the toy saw every prompt; episodes go through it too."""
    model, tok = tiny
    toy = Policy(model, tok, rollout=RolloutConfig(backend="toy_greedy"))
    own = Policy(model, tok)
    sampled = toy.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(0))
    control = own.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(0))
    assert all(g.count(g[0]) == 4 for g in groups([s.completion_ids for s in sampled], 4))
    assert any(g.count(g[0]) < 4 for g in groups([s.completion_ids for s in control], 4))
    assert toy.backend.prompts == [s.prompt_ids for s in sampled] and isinstance(toy.backend, toy_backend.GreedyBackend)
    from postrl.sampling.episodes import EpisodeLimits, sample_episodes

    before = len(toy.backend.prompts)
    episodes = sample_episodes(toy, TASKS, 2, {}, lambda t: EpisodeLimits(8), GenParams(8), torch.Generator())
    assert len(toy.backend.prompts) == before + len(episodes) == before + 8


def test_per_task_params_one_batch_where_the_backend_takes_them_else_one_call_each(tiny):
    """Per-task GenParams: postrl's backend samples them in one call, each task's samples as its
    own GenParams would alone; a backend registered without `row_params` (the toy) is called once
    per distinct GenParams, in order of first appearance, every sample back in its place."""
    model, tok = tiny
    params = [GenParams(8, greedy=True), GenParams(3), GenParams(8, greedy=True), GenParams(3)]
    own = Policy(model, tok)
    calls = []
    inner = own.backend.generate
    own.backend.generate = lambda prompts, p, *a, **k: calls.append(p) or inner(prompts, p, *a, **k)
    mixed = own.sample(TASKS, 2, params, torch.Generator().manual_seed(0))
    assert len(calls) == 1 and len(calls[0]) == 8
    greedy = own.sample(TASKS, 2, GenParams(8, greedy=True), torch.Generator().manual_seed(0))
    short = own.sample(TASKS, 2, GenParams(3), torch.Generator().manual_seed(0))
    for i, s in enumerate(mixed):
        want = (greedy if i // 2 % 2 == 0 else short)[i]
        assert (s.completion_ids, s.group, s.task) == (want.completion_ids, want.group, want.task)
    toy = Policy(model, tok, rollout=RolloutConfig(backend="toy_greedy"))
    parts = []
    inner_toy = toy.backend.generate
    toy.backend.generate = lambda prompts, p, *a, **k: parts.append((len(prompts), p)) or inner_toy(prompts, p, *a, **k)
    split = toy.sample(TASKS, 2, params, torch.Generator().manual_seed(0))
    assert parts == [(4, params[0]), (4, params[1])]
    assert [s.task for s in split] == [t for t in TASKS for _ in range(2)]
    assert all(len(s.completion_ids) <= (8 if g % 2 == 0 else 3) for g, s in ((s.group, s) for s in split))
    with pytest.raises(ValueError, match="one per task"):
        own.sample(TASKS, 2, params[:2])


def test_weights_are_loaded_once_per_version_and_again_after_a_restore(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    log = tmp_path / "loads"
    monkeypatch.setenv(toy_backend.LOG, str(log))
    policy = Policy(model, tok, rollout=RolloutConfig(backend="toy_greedy"))
    assert toy_backend.loads(log) == []  # built lazily: nothing until the first sampling call

    def sample_then_loads():
        policy.sample(TASKS[:2], 2, GenParams(4), torch.Generator().manual_seed(0))
        return [v for _, v in toy_backend.loads(log)]

    assert sample_then_loads() == [0]
    assert sample_then_loads() == [0]  # the same version: nothing to load
    policy.version = 2  # the learner's updates, in place on the shared model
    assert sample_then_loads() == [0, 2]
    policy.load_weights(None, 2)  # a restore wrote weights under a number already loaded
    assert sample_then_loads() == [0, 2, 2]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    policy.load_weights(state, 5)  # an engine's copy of a published version
    assert policy.version == 5 and sample_then_loads() == [0, 2, 2, 5]


@pytest.mark.parametrize("extra", [[], ["pipeline.max_staleness=1"]], ids=["inline", "threaded"])
def test_rollout_backend_selects_the_backend_of_a_run(tiny_model_dir, tmp_path, monkeypatch, extra):
    """`rollout.backend=toy_greedy` (registered by the recipe's `imports:`): every sample of the run
    is the toy's (greedy groups), and each engine's policy loaded each version once."""
    log = tmp_path / "loads"
    monkeypatch.setenv(toy_backend.LOG, str(log))
    run_dir = run_train(tiny_model_dir, tmp_path / "run", "train.total_steps=3", "rollout.backend=toy_greedy",
                        f"imports=[{toy_backend.__file__}]", *extra)
    got = rows(run_dir)
    by_group: dict[tuple[int, int], list] = {}
    for r in got:
        by_group.setdefault((r["step"], r["group"]), []).append(r["token_ids"])
    assert len(got) == 3 * 16 and all(g.count(g[0]) == len(g) for g in by_group.values())
    loads = toy_backend.loads(log)
    assert {r["policy_version"] for r in got} <= {v for _, v in loads}
    assert len(loads) == len(set(loads))  # each backend loaded each version once
