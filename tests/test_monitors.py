"""Each monitor fires on a trajectory built to trigger it and stays silent on a healthy one;
alerts, their log, monitor state across a checkpoint, and spot-check dumps."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import typing

import pytest
from rich.console import Console

from postrl.errors import UserError
from postrl.monitor.alerts import Alert, AlertLog, dump_samples, read_alerts
from postrl.monitor.base import MonitorContext, Trigger
from postrl.monitor.monitors import MONITORS, build_monitors
from postrl.monitor.on_samples import Tampering, repeat_fraction
from postrl.monitor.settings import MonitorConfig, TamperingConfig

STEPS = 30
# As a recipe would weight them: correctness counts, the answer-tag format term adds a little.
CTX = MonitorContext(reward_weights={"arith": {"correct": 1.0, "format_answer_tag": 0.2}})
HEALTHY_TEXTS = [
    "The product of 6 and 7 is 42, so the answer is 42.",
    "def add(a, b):\n    return a + b\n",
    "First add the tens, then the units: 30 + 12 = 42.",
    "def solve(xs):\n    return sorted(set(xs))[:3]\n",
]


def healthy_metrics(step: int, rng: random.Random) -> dict[str, float]:
    """A run that learns: pass rate climbs, entropy eases down, KL stays small, length barely moves."""
    progress = step / STEPS
    pass_rate = 0.2 + 0.5 * progress + rng.uniform(-0.03, 0.03)
    return {
        "reward/mean": pass_rate + 0.05,
        "pass_rate": pass_rate,
        "entropy": 1.2 - 0.4 * progress + rng.uniform(-0.05, 0.05),
        "kl/mean": 0.01 + 0.02 * progress + rng.uniform(0, 0.01),
        "response_len/mean": 20 + 3 * progress + rng.uniform(-1, 1),
        "loss": 0.5 + rng.uniform(-0.1, 0.1),
        "grad_norm": 1.0 + rng.uniform(-0.2, 0.2),
    }


def healthy_samples(make_sample, step: int) -> list:
    return [
        make_sample(text, task_id=f"t{i}", group=i // 2, reward=1.0 if i % 2 else 0.1, correct=bool(i % 2),
                    components={"correct": 1.0 if i % 2 else 0.0, "format_answer_tag": 1.0})
        for i, text in enumerate(HEALTHY_TEXTS)
    ]


def trajectory(make_sample, edit_metrics=None, edit_samples=None):
    """Healthy steps, optionally edited per step to plant a failure."""
    rng = random.Random(0)
    out = []
    for step in range(STEPS):
        metrics, samples = healthy_metrics(step, rng), healthy_samples(make_sample, step)
        if edit_metrics:
            edit_metrics(step, metrics)
        if edit_samples:
            samples = edit_samples(step, samples)
        out.append((metrics, samples))
    return out


def run_monitors(traj, cfg: MonitorConfig | None = None, monitors=None) -> list[Alert]:
    monitors = monitors or build_monitors(cfg or MonitorConfig(), CTX)
    alerts = []
    for step, (metrics, samples) in enumerate(traj):
        alerts += monitors.update(step, metrics, samples)
    return alerts


def test_healthy_run_raises_nothing(make_sample):
    monitors = build_monitors(MonitorConfig(), CTX)
    assert sorted(monitors.monitors) == MONITORS.names()
    assert run_monitors(trajectory(make_sample), monitors=monitors) == []
    values = monitors.values()
    assert 0 < values["monitor/format_share"] < 0.5 and values["monitor/tampering_share"] == 0


def _set(name, value_fn):
    def edit(step, metrics):
        v = value_fn(step, metrics)
        if v is not None:
            metrics[name] = v

    return edit


FAILURES = {
    # name: (metric edit, sample edit, expected (monitor, first step))
    "entropy floor": (_set("entropy", lambda s, m: 0.01 if s >= 10 else None), None, ("entropy_collapse", 12)),
    "entropy share": (_set("entropy", lambda s, m: 2.0 if s == 0 else (0.15 if s >= 5 else 1.8)), None,
                      ("entropy_collapse", 7)),
    "kl relative": (_set("kl/mean", lambda s, m: 0.4 if s == 15 else None), None, ("kl_spike", 15)),
    "kl absolute": (_set("kl/mean", lambda s, m: 1.5 if s == 1 else None), None, ("kl_spike", 1)),
    "length drift": (lambda s, m: m.update({"response_len/mean": 20 + 3 * s, "pass_rate": 0.3, "reward/mean": 0.3}), None,
                     ("length_drift", 11)),
    "verifier": (lambda s, m: m.update({"reward/mean": 0.1 + 0.03 * s, "pass_rate": 0.1}), None,
                 ("verifier_disagreement", 2)),
    "non-finite loss": (_set("loss", lambda s, m: math.nan if s == 5 else None), None, ("non_finite", 5)),
    "format share": (None, lambda s, samples: [dataclasses.replace(x) for x in samples] if s < 20 else [
        _fmt_only(x) for x in samples], ("format_share", 21)),
    "repetition": (None, lambda s, samples: samples if s < 8 else [_looping(x) for x in samples],
                   ("repetition", 9)),
    "tampering": (None, lambda s, samples: samples if s != 4 else samples[:-1] + [_tamper(samples[-1])],
                  ("test_tampering", 4)),
}


def _fmt_only(sample):
    sample.score.components = {"correct": 0.0, "format_answer_tag": 1.0}
    sample.score.reward = 0.2
    return sample


def _looping(sample):
    sample.completion_ids = [5, 6, 7, 8, 9] * 8
    return sample


def _tamper(sample):
    sample.text = "def check(candidate):\n    return True\n"
    return sample


@pytest.mark.parametrize("case", list(FAILURES))
def test_monitor_fires_on_its_failure_once(make_sample, case):
    edit_metrics, edit_samples, (name, first_step) = FAILURES[case]
    alerts = run_monitors(trajectory(make_sample, edit_metrics, edit_samples))
    assert [(a.name, a.step) for a in alerts] == [(name, first_step)], [a.message for a in alerts]
    assert alerts[0].action == getattr(MonitorConfig(), name).action and alerts[0].message


def test_format_share_weighs_components_and_ignores_unweighted_domains(make_sample):
    monitor = build_monitors(MonitorConfig(), CTX).monitors["format_share"]
    # 2 samples: correct (1.0*1 + 0.2*1) and format-only (0.2*1): format earns 0.4 of 1.4.
    samples = [make_sample(components={"correct": 1.0, "format_answer_tag": 1.0}),
               _fmt_only(make_sample())]
    monitor.update(0, {}, samples)
    assert monitor.values["monitor/format_share"] == pytest.approx(0.4 / 1.4)
    # A domain with no reward weights earns its own reward: nothing of it is format.
    monitor.update(1, {}, [make_sample(domain="code", components={"format_x": 5.0}, reward=1.0)])
    assert monitor.values["monitor/format_share"] == 0.0


def test_length_growth_with_rising_pass_rate_is_not_drift(make_sample):
    edit = lambda s, m: m.update({"response_len/mean": 20 + 3 * s, "pass_rate": 0.1 + 0.02 * s})  # noqa: E731
    assert run_monitors(trajectory(make_sample, edit)) == []


def test_reward_rise_confirmed_by_pass_rate_is_not_disagreement(make_sample):
    edit = lambda s, m: m.update({"reward/mean": 0.1 + 0.03 * s, "pass_rate": 0.05 + 0.025 * s})  # noqa: E731
    assert run_monitors(trajectory(make_sample, edit)) == []


def test_non_finite_rearms_after_recovery_and_uses_configured_action(make_sample):
    cfg = MonitorConfig()
    cfg.non_finite.action = "rollback"
    nan_steps = {5, 6, 7, 20}
    edit = _set("grad_norm", lambda s, m: math.inf if s in nan_steps else None)
    alerts = run_monitors(trajectory(make_sample, edit), cfg)
    assert [(a.step, a.action) for a in alerts] == [(5, "rollback"), (20, "rollback")]
    assert alerts[0].data == {"grad_norm": math.inf}


def test_trigger_patience_and_rearm():
    t = Trigger(2)
    assert [t.observe(b) for b in (True, True, True, False, True, True)] == [False, True, False, False, False, True]


@pytest.mark.parametrize(
    "text",
    [
        "def check(candidate):\n    pass",
        "candidate = lambda *a: 42",
        "import sys\nsys.exit(0)",
        "import os; os._exit(0)",
        "raise SystemExit",
        "class Eq:\n    def __eq__(self, other):\n        return True",
        "AssertionError = Exception",
        "import unittest\nunittest.main = lambda: None",
        "__builtins__.print = None",
        "globals()['check'] = f",
        "exit()",
    ],
)
def test_tampering_patterns_flag(text):
    assert Tampering(TamperingConfig(), MonitorContext()).find(text)


@pytest.mark.parametrize(
    "text",
    [
        "def add(a, b):\n    return a + b",
        "if check == 2:\n    checksum = 3\n    self.check = 1",
        "def exits(x):\n    return x.exit_code",
        "The answer is 42.",
    ],
)
def test_tampering_patterns_leave_honest_code_alone(text):
    assert Tampering(TamperingConfig(), MonitorContext()).find(text) == []


def test_tampering_allows_the_tasks_own_entry_point():
    assert Tampering(TamperingConfig(), MonitorContext()).find("def check(x):\n    return x > 0", allowed="check") == []


def test_repeat_fraction():
    assert repeat_fraction([1, 2, 3, 4, 5, 6, 7, 8], 4) == 0.0
    assert repeat_fraction([1, 2] * 4, 4) == pytest.approx(1 - 2 / 5)
    assert repeat_fraction([1, 2, 3], 4) is None


def test_state_round_trip_gives_identical_alerts(make_sample):
    """A run resumed from monitor state mid-trajectory raises exactly what an uninterrupted one does."""
    def edit(s, m):
        m.update({"response_len/mean": 20 + 3 * s, "pass_rate": 0.3, "reward/mean": 0.1 + 0.03 * s})
        if s >= 16:
            m["entropy"] = 0.01

    traj = trajectory(make_sample, edit)
    expected = run_monitors(traj)
    assert {a.name for a in expected} == {"length_drift", "verifier_disagreement", "entropy_collapse"}
    first = build_monitors(MonitorConfig(), CTX)
    alerts = [a for step in range(15) for a in first.update(step, *traj[step])]
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    second = build_monitors(MonitorConfig(), CTX)
    second.load_state_dict(state)
    alerts += [a for step in range(15, STEPS) for a in second.update(step, *traj[step])]
    assert alerts == expected
    # Without the state, the resumed half re-raises the latched alerts: the state is what prevents it.
    fresh = build_monitors(MonitorConfig(), CTX)
    second_half = [a for step in range(15, STEPS) for a in fresh.update(step, *traj[step])]
    assert len(second_half) > len([a for a in expected if a.step >= 15])


def test_build_monitors_validates_action_and_skips_disabled():
    cfg = MonitorConfig()
    cfg.repetition.enabled = False
    assert "repetition" not in build_monitors(cfg).monitors
    cfg.kl_spike.action = "panic"
    with pytest.raises(UserError, match="monitor.kl_spike.action"):
        build_monitors(cfg)


def test_alert_log_writes_jsonl_prints_and_truncates_on_resume(tmp_path):
    buf = io.StringIO()
    log = AlertLog(tmp_path, console=Console(file=buf, width=200))
    log.record([Alert(3, "kl_spike", "kl/mean 0.9 [big]", "warn", {"kl": 0.9}),
                Alert(7, "non_finite", "non-finite loss=nan", "stop", {"loss": math.nan})])
    lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 3, "name": "kl_spike", "message": "kl/mean 0.9 [big]", "action": "warn",
                        "data": {"kl": 0.9}}
    assert lines[1]["data"] == {"loss": None}
    printed = buf.getvalue()
    assert "step 3 kl_spike (warn): kl/mean 0.9 [big]" in printed and "non_finite (stop)" in printed
    back = read_alerts(tmp_path)
    assert [(a.step, a.name, a.action) for a in back] == [(3, "kl_spike", "warn"), (7, "non_finite", "stop")]
    assert math.isnan(back[1].data["loss"])
    AlertLog(tmp_path, console=Console(file=io.StringIO()), resume_step=5)
    assert [a.step for a in read_alerts(tmp_path)] == [3]


def test_dump_samples_picks_highest_lowest_and_random(tmp_path, make_sample):
    samples = [make_sample(f"answer {i}", task_id=f"t{i}", reward=i / 10, correct=i > 5,
                           components={"correct": i / 10, "format": 0.0}) for i in range(10)]
    samples[3].text = "uses ``` fences"
    path = dump_samples(tmp_path, 40, samples, k=2)
    assert path == tmp_path / "samples" / "step_40.md"
    picks = [json.loads(x) for x in (tmp_path / "samples" / "step_40.jsonl").read_text().splitlines()]
    assert [p["kind"] for p in picks] == ["highest"] * 2 + ["lowest"] * 2 + ["random"] * 2
    assert [p["task_id"] for p in picks[:4]] == ["t9", "t8", "t0", "t1"]
    randoms = {p["task_id"] for p in picks[4:]}
    assert len(randoms) == 2 and randoms.isdisjoint({"t9", "t8", "t0", "t1"})
    assert picks[0]["components"] == {"correct": 0.9, "format": 0.0}
    md = path.read_text()
    assert md.count("## ") == 6 and "reward terms: correct=0.9, format=0" in md
    if "t3" in randoms:
        assert "````\nuses ``` fences\n````" in md
    again = dump_samples(tmp_path, 40, samples, k=2)  # deterministic: same picks for the same step
    assert again.read_text() == md


def test_run_config_monitor_section_is_these_settings():
    """The loop's config tree holds the monitors' own settings class (postrl.monitor.settings), not
    a copy that could drift from it."""
    import postrl.config.schema as config

    assert typing.get_type_hints(config.Config)["monitor"] is MonitorConfig


def test_monitor_settings_load_through_the_config_loader():
    """The settings use only types postrl.config can load from YAML and dotted overrides."""
    from postrl.config.loading import from_dict
    from postrl.errors import ConfigError

    cfg = from_dict(MonitorConfig, {
        "sinks": ["tensorboard", "mlflow"],
        "kl_spike": {"max_kl": 2, "action": "rollback"},
        "verifier_disagreement": {"pairs": {"reward/arith": "pass_rate/arith"}},
        "test_tampering": {"protected_names": ["check"]},
    }, "monitor.")
    assert cfg.kl_spike.max_kl == 2.0 and cfg.kl_spike.action == "rollback"
    assert cfg.verifier_disagreement.pairs == {"reward/arith": "pass_rate/arith"}
    assert build_monitors(cfg).monitors["kl_spike"].cfg.max_kl == 2.0
    with pytest.raises(ConfigError, match="monitor.kl_spike.max_k"):
        from_dict(MonitorConfig, {"kl_spike": {"max_k": 1}}, "monitor.")


# ---------------------------------------------------------------------------- which checkpoint a rollback restores


def _checkpoints(root, steps, keep_last=10):
    from postrl.checkpoint import CheckpointManager

    ckpts = CheckpointManager(root, keep_last=keep_last, log=lambda m: None)
    for step in steps:
        ckpts.save(step, {"step": step}, lambda d, s=step: (d.mkdir(), (d / "w.bin").write_bytes(bytes([s]))),
                   score=float(step == 6))  # the best by eval: step 6
    return ckpts


def test_a_rollback_goes_to_the_kept_checkpoint_nearest_the_named_step_not_after_it(tmp_path):
    from postrl.run import rollback_target

    ckpts = _checkpoints(tmp_path, [2, 4, 6, 8])
    named = lambda step, action="rollback": Alert(9, "proxy_gold", "m", action, {"rollback_step": float(step)})  # noqa: E731
    assert rollback_target(ckpts, [named(5)]).step == 4  # at or before the peak, the nearest
    assert rollback_target(ckpts, [named(4)]).step == 4  # checkpoint 4 holds the weights that sampled step 4
    assert rollback_target(ckpts, [named(1)]).step == 2  # none kept at or before: the nearest after
    assert rollback_target(ckpts, [named(7), named(3)]).step == 2  # two alerts: far enough back for both
    assert rollback_target(ckpts, [Alert(9, "kl_spike", "m", "rollback")]).step == 8  # none named: the newest
    assert rollback_target(ckpts, [named(3, "warn"), Alert(9, "kl_spike", "m", "rollback")]).step == 8
    (ckpts.root / "step_00000004" / "model" / "w.bin").write_bytes(b"damaged")
    assert rollback_target(ckpts, [named(5)]).step == 2  # a damaged one is skipped, still not after the peak
    for step in (2, 6, 8):
        (ckpts.root / f"step_{step:08d}" / "meta.json").unlink()
    assert rollback_target(ckpts, [named(5)]) is None  # none intact: act_on stops the run instead


def test_a_rollback_drops_the_checkpoints_of_the_abandoned_branch(tmp_path):
    ckpts = _checkpoints(tmp_path, [2, 4, 6, 8])
    assert ckpts.best()["step"] == 6 and (ckpts.root / "latest").read_text() == "step_00000008"
    assert ckpts.drop_after(4) == [6, 8]
    assert ckpts.steps() == [2, 4] and ckpts.latest_valid().step == 4  # a resume cannot pick up step 8
    assert (ckpts.root / "latest").read_text() == "step_00000004"
    assert ckpts.best() is None  # it named a dropped checkpoint
    assert ckpts.drop_after(4) == [] and ckpts.steps() == [2, 4]


def test_proxy_gold_asks_a_rollback_for_the_weights_of_its_gold_peak(make_sample):
    from postrl.monitor.proxy_gold import ProxyGold
    from postrl.monitor.settings import ProxyGoldConfig

    monitor = ProxyGold(ProxyGoldConfig(action="rollback", smooth_steps=1), None)
    fired = []  # gold peaks at step 1, dips within min_gold_drop, then falls while the proxy climbs
    for step, (proxy, gold) in enumerate([(0.1, 0.2), (0.2, 0.6), (0.3, 0.58), (0.5, 0.3)]):
        fired += monitor.update(step, {}, [make_sample(reward=proxy, components={"rm": proxy, "gold": gold})] * 4)
    (alert,) = fired
    assert alert.step == 3 and alert.data["best_step"] == alert.data["rollback_step"] == 1.0
