"""The device: `run.device`, every tensor created on the model's device, no silent CPU fallback.

A CPU-only machine cannot put a model on a second real device, so the tests make the *default*
device a wrong one: inside `tensors_must_name_their_device()` the default device is `meta` and
any operation that produces a meta tensor fails on the spot. The model stays on the CPU, so code
that creates its tensors on the model's device runs normally, and any `torch.zeros(...)`,
`torch.tensor(...)` or `torch.arange(...)` that forgot the device, which on a GPU machine would
be a CPU tensor meeting a CUDA model, is caught here, on any machine, with the op that made it.
"""

from __future__ import annotations

import datetime
from contextlib import ExitStack, contextmanager

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from postrl.builtin_models import load_model
from postrl.cli import main
from postrl.config.loading import load_config
from postrl.config.schema import LoraConfig, ModelConfig, RLConfig, TrainConfig
from postrl.errors import ConfigError, UserError
from postrl.learner.distributed import Ranks
from postrl.learner.learner import Learner
from postrl.learner.sharded import end_group, start_group
from postrl.model.device import model_device, resolve_device
from postrl.model.logprobs import token_logprobs
from postrl.model.lora import apply_lora, make_reference
from postrl.records import Task
from postrl.rewards.models.rm import RewardModel
from postrl.rewards.verifiers import VerifierSettings, make_verifier
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy


class _DefaultDeviceTrap(TorchDispatchMode):
    """Fails every op whose result is on the meta device (the default device inside the trap)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_flatten(out)[0]):
            raise AssertionError(f"{func} made a tensor on the default device, not the model's")
        return out


@contextmanager
def tensors_must_name_their_device():
    with torch.device("meta"), _DefaultDeviceTrap():
        yield


def test_the_trap_catches_a_tensor_created_without_the_models_device(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir), log=lambda *_: None)
    weight = model.model.embed_tokens.weight
    with tensors_must_name_their_device(), pytest.raises(AssertionError, match="default device"):
        weight[torch.arange(3)]  # the bug: arange on the default device, the weight on the model's
    with tensors_must_name_their_device():
        assert weight[torch.arange(3, device=weight.device)].device == weight.device


@contextmanager
def one_sharded_rank():
    """The sharded learner's `Ranks` for a world of one, in this process (FSDP2 over gloo)."""
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
    start_group(store, 0, 1, torch.device("cpu"), timeout)
    try:
        yield Ranks(0, 1, dist.ProcessGroupGloo(store, 0, 1, timeout), torch.get_num_threads(), sharded=True)
    finally:
        end_group()


@pytest.mark.parametrize("kind", ["fastlm", "lora", "sharded"])
def test_sampling_logprobs_and_update_create_every_tensor_on_the_models_device(tiny_model_dir, kind):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    if kind == "lora":
        model = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    policy = Policy(model, tok)
    with ExitStack() as stack:
        ranks = stack.enter_context(one_sharded_rank()) if kind == "sharded" else None
        _sample_and_update_in_the_trap(policy, ranks)


def _sample_and_update_in_the_trap(policy: Policy, ranks: Ranks | None) -> None:
    model = policy.model
    learner = Learner(policy, make_reference(model), TrainConfig(minibatches=1, samples_per_prompt=4,
                                                                 max_tokens_per_microbatch=40),
                      RLConfig(kl_coef=0.1, entropy_coef=0.01), ModelConfig(logits_chunk_mib=1e-4), ranks=ranks)
    tasks = [Task("t", f"t/{i}", f"{i}+{i}=", "0") for i in range(2)]
    sample_gen, order_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    with tensors_must_name_their_device():
        samples = policy.sample(tasks, 4, GenParams(6, stop_strings=("=",)), sample_gen)
        for s in samples:
            s.advantage = 0.0
        batch = learner.build_batch(samples, 0.1)
        stats = learner.update(batch, 0.1, order_gen)
        learner.train_cfg.pack_sequences = True
        stats = learner.update(batch, 0.1, order_gen)
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures, pack=True)
        learner.state_dict()
    assert batch.input_ids.device == model_device(model) == logp.device
    assert stats.optimizer_steps == 1 and stats.grad_norm > 0


def test_asking_for_cuda_without_one_is_an_error_not_a_fallback(tiny_model_dir, tmp_path, capsys):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UserError, match="run.device"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="run.device"):
        load_config(None, ["run.device=gpu"])
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the missing-device error cannot happen here")
    with pytest.raises(UserError, match="no CUDA device"):
        resolve_device("cuda")
    run_dir = tmp_path / "run"
    code = main(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
                 "run.device=cuda", "run.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "run.device=cuda" in err[-1] and not run_dir.exists()


def test_the_whole_loop_runs_with_run_device_cpu_given_explicitly(tiny_model_dir, tmp_path):
    import yaml
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    code = main(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
                 "run.device=cpu", "train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
                 "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false",
                 "rl.entropy_coef=0.01", "train.pack_sequences=true", "train.max_tokens_per_microbatch=64"])
    assert code == 0
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["device"] == "cpu"
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_eval_puts_the_model_on_the_device_asked_for_and_refuses_a_missing_one(tiny_model_dir, capsys, monkeypatch):
    """`postrl eval` (--device; with --recipe its run.device) and `postrl.evaluate` sample on the
    device asked for: cpu here, given explicitly, and a missing CUDA is one line before any model loads."""
    import json

    import postrl.builtin_models as builtin_models

    loaded = []
    real_load = builtin_models.load_model
    monkeypatch.setattr(builtin_models, "load_model", lambda *a, **k: loaded.append(a) or real_load(*a, **k))
    args = ["eval", str(tiny_model_dir), "--problems", "2", "--samples", "2", "--k", "1", "--json"]
    assert main([*args, "--device", "cpu"]) == 0
    assert set(json.loads(capsys.readouterr().out)["arith"]) >= {"greedy", "pass@1"}
    assert main([*args, "--recipe", "recipes/default.yaml", "eval.num_problems=2", "run.device=cpu"]) == 0
    capsys.readouterr()
    assert len(loaded) == 2
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the missing-device error cannot happen here")
    for extra, line in ((["--device", "cuda"], "error: --device cuda: torch sees no CUDA device here"),
                        (["--recipe", "recipes/default.yaml", "run.device=cuda"],
                         "error: run.device=cuda: torch sees no CUDA device here"),
                        (["--recipe", "recipes/default.yaml", "--device", "cuda"],
                         "error: run.device=cuda: torch sees no CUDA device here")):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(line), err
    assert len(loaded) == 2  # refused before loading


def test_a_reward_model_scores_on_the_device_it_was_loaded_on(tmp_path):
    RewardModel.create("ab", hidden=16, layers=1).save(tmp_path / "rm")
    rm = RewardModel.load(tmp_path / "rm", "cpu")
    with tensors_must_name_their_device():
        scores = rm.score(["ab", "ba"], ["a", "bb"])
    assert len(scores) == 2 and model_device(rm.model) == torch.device("cpu")
    with pytest.raises(UserError, match=r"^domains.NAME.params.rm_device='gpu': expected one of"):
        make_verifier(f"rm:{tmp_path / 'rm'}", VerifierSettings(rm_device="gpu"))
