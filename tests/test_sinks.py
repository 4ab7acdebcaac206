"""Metric sinks: metrics.jsonl, TensorBoard event files read back with tensorboard's own reader."""

from __future__ import annotations

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from postrl.errors import UserError
from postrl.monitor.sinks import SINKS, JsonlSink, TensorBoardSink, make_sinks, read_metrics

STEP_METRICS = {"reward/mean": 0.5, "reward/arith": 0.25, "kl/mean": 0.01, "loss": 1.5}


def _scalars(logdir):
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return acc, {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_lines_have_step_and_nonfinite_becomes_null(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.log(0, STEP_METRICS)
    sink.log(1, {"loss": float("nan"), "grad_norm": float("inf")})
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 0, **STEP_METRICS}
    assert json.loads(lines[1]) == {"step": 1, "loss": None, "grad_norm": None}
    metrics = read_metrics(tmp_path)
    assert metrics[0] == STEP_METRICS and math.isnan(metrics[1]["loss"])


def test_read_metrics_skips_torn_line_and_keeps_last_write(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 2.0}\n{"step": 0, "loss": 3.0}\n{"step": 2, "lo')
    assert read_metrics(tmp_path) == {0: {"loss": 3.0}, 1: {"loss": 2.0}}


def test_jsonl_resume_drops_steps_to_be_rerun(tmp_path):
    sink = JsonlSink(tmp_path)
    for step in range(4):
        sink.log(step, {"loss": float(step)})
    JsonlSink(tmp_path, resume_step=2).log(2, {"loss": 20.0})
    assert read_metrics(tmp_path) == {0: {"loss": 0.0}, 1: {"loss": 1.0}, 2: {"loss": 20.0}}
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_tensorboard_files_readable_with_expected_tags(tmp_path):
    sink = TensorBoardSink(tmp_path)
    for step in range(3):
        sink.log(step, {k: v + step for k, v in STEP_METRICS.items()})
    sink.close()
    _, scalars = _scalars(tmp_path / "tb")
    assert set(scalars) == set(STEP_METRICS)
    assert scalars["reward/mean"] == [(0, 0.5), (1, 1.5), (2, 2.5)]
    assert scalars["loss"][2] == (2, pytest.approx(3.5))


def test_tensorboard_resume_discards_orphaned_steps(tmp_path):
    first = TensorBoardSink(tmp_path)
    for step in range(5):
        first.log(step, {"loss": float(step)})
    first.close()  # the "crashed" run got to step 4; the checkpoint was at step 2
    second = TensorBoardSink(tmp_path, resume_step=3)
    for step in range(3, 5):
        second.log(step, {"loss": 10.0 * step})
    second.close()
    _, scalars = _scalars(tmp_path / "tb")
    assert scalars["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_make_sinks_always_has_jsonl_and_fans_out(tmp_path):
    sinks = make_sinks(tmp_path, ["tensorboard"])
    assert [type(s).__name__ for s in sinks.sinks] == ["JsonlSink", "TensorBoardSink"]
    sinks.log(7, {"lr": 1e-4})
    sinks.close()
    assert read_metrics(tmp_path) == {7: {"lr": 1e-4}}
    assert _scalars(tmp_path / "tb")[1] == {"lr": [(7, pytest.approx(1e-4))]}
    assert [type(s).__name__ for s in make_sinks(tmp_path, []).sinks] == ["JsonlSink"]


def test_unknown_sink_is_a_user_error(tmp_path):
    assert {"jsonl", "tensorboard", "mlflow", "wandb"} <= set(SINKS.names())
    with pytest.raises(UserError) as e:
        make_sinks(tmp_path, ["tensorbord"])
    assert str(e.value) == ("config key 'monitor.sinks' = 'tensorbord': unknown metric sink; did you mean "
                            "'tensorboard'? (expected one of: jsonl, mlflow, tensorboard, wandb)")
    assert not (tmp_path / "metrics.jsonl").exists()  # checked before any sink opened a file
