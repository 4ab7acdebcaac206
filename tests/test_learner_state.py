"""The learner owns its state (postrl.learner.learner): `state_dict` / `load_state_dict` continue a
learner bit for bit (bf16 master weights included), `scale_lr` scales the schedule, the other
data-parallel ranks are sent the state after each change and only then (typed messages), a batch
of broken groups is refused, and a checkpoint of the previous layout (format 2) resumes bitwise."""

import datetime
import io
import json
import pickle

import pytest
import torch
import torch.distributed as dist
from test_async import rows, run_train, same_weights, weights

from postrl.builtin_models import load_model
from postrl.checkpoint import CheckpointManager, sha256
from postrl.config.schema import RLConfig, TrainConfig
from postrl.errors import ConfigError, UserError
from postrl.learner.batch import check_whole_groups
from postrl.learner.distributed import LoadState, Ranks, Update
from postrl.learner.learner import Learner
from postrl.loop import resume_config, train
from postrl.records import Task
from postrl.run import CHECKPOINT_FORMAT, upgrade_checkpoint_state
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy


@pytest.fixture(scope="module")
def samples(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    tasks = [Task("t", f"t/{i}", f"{i}+{i * 7}=", "0") for i in range(4)]
    return Policy(model, tok).sample(tasks, 4, GenParams(8), torch.Generator().manual_seed(0))


def _learner(tiny_model_dir, dtype: str = "float32", ranks=None, **train) -> Learner:
    model, tok = load_model(str(tiny_model_dir), dtype=dtype, log=lambda *_: None)
    cfg = TrainConfig(**{"lr": 1e-3, "minibatches": 2, "samples_per_prompt": 4, **train})
    return Learner(Policy(model, tok), None, cfg, RLConfig(kl_coef=0.0), ranks=ranks)


def _update(learner: Learner, samples, seed: int):
    batch = learner.build_batch(samples, 0.0)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])
    return learner.update(batch, 0.0, torch.Generator().manual_seed(seed))


def _params(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.policy.model.parameters()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_state_dict_round_trip_continues_bit_for_bit(tiny_model_dir, samples, dtype):
    first = _learner(tiny_model_dir, dtype, warmup_steps=5)
    for seed in range(2):
        _update(first, samples, seed)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)  # as a checkpoint holds it
    saved.seek(0)
    second, cold = _learner(tiny_model_dir, dtype, warmup_steps=5), _learner(tiny_model_dir, dtype, warmup_steps=5)
    for other in (second, cold):
        other.policy.model.load_state_dict(first.policy.model.state_dict())  # a checkpoint's model directory
    second.load_state_dict(torch.load(saved, weights_only=False))
    assert second.policy.version == first.policy.version == 4  # 2 updates x 2 minibatches
    if dtype == "bfloat16":  # the float32 masters, not the bf16 weights, come back
        masters = first.opt._masters()
        assert all(torch.equal(a, b) for a, b in zip(second.opt._masters(), masters))
        assert any(not torch.equal(m, p.float()) for m, p in zip(masters, first.policy.model.parameters()))
    stats = [_update(learner, samples, 2) for learner in (first, second, cold)]
    assert stats[1].lr == stats[0].lr != stats[2].lr  # mid warm-up: the schedule's position came back
    assert all(torch.equal(a, b) for a, b in zip(_params(second), _params(first)))
    assert not all(torch.equal(a, b) for a, b in zip(_params(cold), _params(first)))  # the state mattered


def test_scale_lr_scales_the_rate_and_the_warm_up_and_is_saved(tiny_model_dir, samples):
    plain, scaled = _learner(tiny_model_dir, warmup_steps=4), _learner(tiny_model_dir, warmup_steps=4)
    scaled.scale_lr(0.5)
    assert scaled.opt.param_groups[0]["lr"] == 0.5 * plain.opt.param_groups[0]["lr"] == 0.5 * 1e-3 / 4
    got, want = _update(scaled, samples, 0).lr, _update(plain, samples, 0).lr  # 2 steps into the warm-up
    assert want == pytest.approx(1e-3 * 3 / 4, rel=1e-12) and got == pytest.approx(want / 2, rel=1e-12)
    restored = _learner(tiny_model_dir, warmup_steps=4)
    restored.load_state_dict(scaled.state_dict())
    assert restored.sched.base_lrs == scaled.sched.base_lrs == [0.5e-3]
    assert restored.opt.param_groups[0]["lr"] == scaled.opt.param_groups[0]["lr"]


class _Orders:
    """A rank's order queue as rank 0's `Ranks` uses it: what was put, unpickled."""

    def __init__(self):
        self.sent = []

    def put(self, data: bytes) -> None:
        self.sent.append(pickle.loads(data))

    def taken(self) -> list:
        out, self.sent = self.sent, []
        return out


def test_the_other_ranks_get_the_state_after_each_change_and_only_then(tiny_model_dir, samples):
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))  # one rank's reductions
    orders = _Orders()
    ranks = Ranks(0, 1, group, torch.get_num_threads(), peers=[(None, orders)])
    learner = _learner(tiny_model_dir, ranks=ranks)
    _update(learner, samples, 0)
    first, update = orders.taken()
    assert isinstance(first, LoadState) and isinstance(update, Update)  # at the start: a fresh optimiser each
    assert first.learner["policy_version"] == 0 and update.kl_coef == 0.0
    _update(learner, samples, 1)
    assert [type(m) for m in orders.taken()] == [Update]
    state = learner.state_dict()
    _update(learner, samples, 2)
    orders.taken()
    learner.load_state_dict(state)  # a checkpoint load
    learner.scale_lr(0.5)  # then rollback's LR change: still one send
    _update(learner, samples, 3)
    sent, _ = orders.taken()
    assert isinstance(sent, LoadState) and sent.learner["policy_version"] == 4
    assert sent.learner["scheduler"]["base_lrs"] == [0.5e-3]
    # what a rank does with it (learner_main): the same weights and state as rank 0 had then
    rank_1 = _learner(tiny_model_dir)
    rank_1.load_rank_state(sent.weights, sent.learner)
    assert rank_1.policy.version == 4 and rank_1.opt.param_groups[0]["lr"] == sent.learner["optimizer"][
        "param_groups"][0]["lr"]
    with pytest.raises(AttributeError):
        sent.learner = {}  # frozen: a message is not changed on its way


def test_whole_contiguous_groups_are_checked():
    check_whole_groups([3, 3, 0, 0, 7, 7], 2)  # any numbering, each group whole and together
    cut_short, interleaved, one_group_twice, split = [0, 0, 1], [0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 1, 2, 2, 1]
    for groups in (cut_short, interleaved, one_group_twice, split):
        with pytest.raises(ValueError, match=r"^a batch must hold whole groups of train.samples_per_prompt = 2 "
                                             r"samples, each group's samples contiguous; got \d+ samples"):
            check_whole_groups(groups, 2)


def test_build_batch_refuses_interleaved_groups_before_any_work(tiny_model_dir, samples):
    learner = _learner(tiny_model_dir)
    interleaved = samples[0::2] + samples[1::2]
    with pytest.raises(ValueError, match=r"got 16 samples of groups 0, 0, 1, 1, 2, 2, 3, 3, 0, 0, "):
        learner.build_batch(interleaved, 0.0)
    assert learner.build_batch(samples, 0.0).advantages.shape == (16,)


def test_an_unknown_loss_aggregation_stops_the_learner_being_built(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    with pytest.raises(ConfigError, match=r"^config key 'rl.loss_agg' = 'token-sum': unknown loss aggregation"):
        Learner(Policy(model, tok), None, TrainConfig(), RLConfig(loss_agg="token-sum"))


# ---------------------------------------------------------------------------- checkpoint formats


def _as_format_2(ckpt_dir) -> None:
    """Rewrite a checkpoint's state.pt in the layout of format 2 (before `Learner.state_dict`: the
    optimiser, scheduler and policy version at the top level), with meta.json's checksum to match."""
    state = torch.load(ckpt_dir / "state.pt", weights_only=False)
    state.update(state.pop("learner"))
    state["format"] = 2
    torch.save(state, ckpt_dir / "state.pt")
    meta = json.loads((ckpt_dir / "meta.json").read_text())
    meta["files"]["state.pt"] = sha256(ckpt_dir / "state.pt")
    (ckpt_dir / "meta.json").write_text(json.dumps(meta))


def test_a_format_2_checkpoint_resumes_bitwise(tiny_model_dir, tmp_path):
    whole = run_train(tiny_model_dir, tmp_path / "whole", "train.total_steps=2")
    part = run_train(tiny_model_dir, tmp_path / "part", "train.total_steps=1", "checkpoint.every_steps=1")
    latest = CheckpointManager(part).latest_valid()
    assert set(latest.load_state()["learner"]) == {"optimizer", "scheduler", "policy_version"}
    _as_format_2(latest.path)
    old = latest.load_state()
    assert old["format"] == 2 and "learner" not in old and old["policy_version"] == 2
    resumed = train(resume_config(part, ["train.total_steps=2"]), resume=True, log=lambda *a: None)
    assert same_weights(weights(whole), weights(resumed))
    assert rows(whole) == rows(resumed)


def test_other_checkpoint_formats_are_refused_with_one_line():
    assert upgrade_checkpoint_state({"format": CHECKPOINT_FORMAT, "learner": {}}, "x") == {
        "format": CHECKPOINT_FORMAT, "learner": {}}
    for state, who in [({}, "an older"), ({"format": 1}, "an older"), ({"format": CHECKPOINT_FORMAT + 1}, "a newer")]:
        with pytest.raises(UserError) as e:
            upgrade_checkpoint_state(state, "runs/x/checkpoints/step_00000002")
        found = state.get("format", 1)
        assert str(e.value) == (f"runs/x/checkpoints/step_00000002: checkpoint format {found}, written by {who} "
                                f"postrl; this version resumes formats 2 and 3 only: start the run again")


def test_a_format_2_state_is_moved_under_learner_unchanged():
    old = {"format": 2, "step": 4, "optimizer": {"state": {}}, "scheduler": {"last_epoch": 8}, "policy_version": 8,
           "rollbacks": 0}
    new = upgrade_checkpoint_state(old, "x")
    assert new == {"format": CHECKPOINT_FORMAT, "step": 4, "rollbacks": 0,
                   "learner": {"optimizer": {"state": {}}, "scheduler": {"last_epoch": 8}, "policy_version": 8}}
    assert old["policy_version"] == 8  # the loaded dict is left as it was
