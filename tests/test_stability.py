"""KL control and alert actions in real runs."""

import json

import pytest
import torch
from safetensors.torch import load_file

from postrl.algo.kl_control import AdaptiveKL, FixedKL, make_kl_controller
from postrl.cli import main


def test_adaptive_kl_moves_toward_the_target_by_hand():
    ctl = AdaptiveKL(init_coef=0.1, target=0.1, horizon=10)
    assert ctl.update(0.3) == pytest.approx(0.1 * (1 + 0.2 / 10))  # above target: error clipped to +0.2
    assert ctl.update(0.0) == pytest.approx(0.1 * 1.02 * (1 - 0.2 / 10))  # below: clipped to -0.2
    assert ctl.update(0.11) == pytest.approx(0.1 * 1.02 * 0.98 * (1 + 0.1 / 10))  # +10% off target
    assert ctl.update(float("nan")) == ctl.coef  # a non-finite estimate leaves it alone
    assert FixedKL(0.05).update(9.0) == 0.05
    assert isinstance(make_kl_controller(0.05, 0.0, 10), FixedKL)
    restored = AdaptiveKL(0.5, 0.1, 10)
    restored.load_state_dict(ctl.state_dict())
    assert restored.coef == ctl.coef


def _args(tiny_model_dir, run_dir, *extra):
    return ["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
            "train.total_steps=4", "train.prompts_per_step=4", "train.samples_per_prompt=4",
            "rl.entropy_coef=0.01", "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]",
            "run.progress=false", *extra]


def test_stop_alert_leaves_a_resumable_run(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    # any KL above 1e-9 counts as a spike: it fires in step 0 (the second minibatch has moved)
    assert main(_args(tiny_model_dir, run_dir, "monitor.kl_spike.max_kl=1e-9", "monitor.kl_spike.action=stop")) == 0
    alerts = [json.loads(x) for x in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["name"], a["action"]) for a in alerts] == [(0, "kl_spike", "stop")]
    assert (run_dir / "checkpoints" / "step_00000001" / "meta.json").is_file()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1

    assert main(["train", "--resume", str(run_dir), "monitor.kl_spike.enabled=false"]) == 0
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_rollback_restores_the_checkpoint_and_lowers_the_learning_rate(tiny_model_dir, tmp_path, capsys):
    """On one learner and on two sharded ranks (whose rank 1 gets the checkpoint's state and the
    new learning rate in messages: the same weights at the end say it took both)."""
    for run, extra in (("one", []), ("sharded", ["train.learners=2", "train.shard=fsdp"])):
        assert main(_args(tiny_model_dir, tmp_path / run, "checkpoint.every_steps=1", "monitor.kl_spike.max_kl=1e-9",
                          "monitor.kl_spike.action=rollback", "monitor.max_rollbacks=1", *extra)) == 0
        out = capsys.readouterr().out
        assert "rolled back to step 1; learning rate x0.5 (rollback 1)" in out
        # the monitor state comes back from the checkpoint too (already fired, quiet while KL stays up)
        assert "stopping at step" not in out
        lrs = [json.loads(x)["lr"] for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(0.5e-4)
    one, two = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("one", "sharded"))
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5)


def test_multi_temperature_sampling_stores_each_samples_temperature(tiny_model_dir, tmp_path):
    from postrl.store.rollouts import read_rows

    run_dir = tmp_path / "run"
    assert main(_args(tiny_model_dir, run_dir, "train.total_steps=1", "train.temperatures=[0.5,1.0]")) == 0
    rows = sorted(read_rows(run_dir), key=lambda r: r.sample)
    assert [r.temperature for r in rows] == [0.5, 1.0] * 8  # cycling within each group of 4
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["entropy/arith"] > 0


def test_seesaw_stop_alert_from_an_eval_stops_the_run(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`Run.evaluate` returns its seesaw alerts and the loop hands them to `act_on` with the step's own."""
    import postrl.run

    scores = iter([0.9, 0.2, 0.2])  # held-out pass@1 after steps 1, 2, 3: a drop of 0.7 after step 2
    monkeypatch.setattr(postrl.run, "evaluate", lambda policy, domains, **kw: {"arith": {"pass@1": next(scores)}})
    run_dir = tmp_path / "run"
    assert main(_args(tiny_model_dir, run_dir, "eval.every_steps=1", "eval.seesaw_drop=0.1",
                      "eval.seesaw_action=stop")) == 0
    assert "stopping at step 2: alert seesaw" in capsys.readouterr().out
    alerts = [json.loads(x) for x in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["name"], a["action"]) for a in alerts] == [(2, "seesaw", "stop")]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "checkpoints" / "step_00000002" / "meta.json").is_file()
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["step_1.json", "step_2.json"]  # no final eval


PEAK_MONITOR = '''
from dataclasses import dataclass
from postrl.monitor.alerts import Alert
from postrl.monitor.monitors import register_monitor

@dataclass
class Settings:
    enabled: bool = True
    action: str = "rollback"
    fire_at: int = 3
    peak: int = 1

@register_monitor("peak_watch", settings=Settings)
class PeakWatch:
    """Fires at every pass through step `fire_at`, naming `peak` as the step to go back to."""
    def __init__(self, cfg, ctx):
        self.cfg, self.values = cfg, {}
    def update(self, step, metrics, samples):
        if step != self.cfg.fire_at:
            return []
        return [Alert(step, "peak_watch", "past the peak", self.cfg.action, {"rollback_step": float(self.cfg.peak)})]
    def state_dict(self):
        return {}
    def load_state_dict(self, state):
        pass
'''


@pytest.fixture
def peak_watch(tmp_path):
    """PEAK_MONITOR's file; afterwards the monitor it registers is forgotten, so that later tests in
    this process (test files share an xdist worker) do not build it into their monitors."""
    from postrl.monitor.monitors import MONITORS
    from postrl.monitor.settings import PLUGIN_SETTINGS

    path = tmp_path / "peak_watch.py"
    path.write_text(PEAK_MONITOR)
    yield path
    MONITORS.remove("peak_watch")
    PLUGIN_SETTINGS.pop("peak_watch", None)


def test_a_rollback_restores_the_checkpoint_nearest_the_step_the_alert_names(tiny_model_dir, tmp_path, peak_watch,
                                                                            capsys):
    run_dir = tmp_path / "run"
    # checkpoints 1..4 exist when it fires in step 3: the newest (4) is after the peak, 1 is at it
    assert main([*_args(tiny_model_dir, run_dir, "train.total_steps=5", "checkpoint.every_steps=1",
                        "checkpoint.keep_last=10", "monitor.max_rollbacks=2"),
                 "--import", str(peak_watch)]) == 0
    out = capsys.readouterr().out
    assert "dropped checkpoints of steps 2, 3, 4: the run goes on from step 1" in out  # the abandoned branch
    assert "rolled back to step 1; learning rate x0.5 (rollback 1)" in out
    # the monitor fires again on the next pass: counted by the run, not read back from checkpoint 1
    # (which was written before any rollback), so the third time it stops instead of looping
    assert "rolled back to step 1; learning rate x0.5 (rollback 2)" in out
    assert "stopping at step 4: alert peak_watch" in out
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # each step once: the rolled-back ones were truncated and run again
    lrs = [json.loads(x)["lr"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(0.5e-4)  # x0.5 of checkpoint 1's
