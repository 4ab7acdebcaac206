"""Progress bars with an ETA for pretraining and eval, drawn by rich on stderr when it is a
terminal (stdout stays clean for --json), and nothing at all when it is not."""

from __future__ import annotations

import json
import sys
import time

from postrl import cli
from postrl.pretrain import PretrainSpec, pretrain
from postrl.ui import Progress


def test_bar_counts_and_estimates_what_is_left(capsys):
    with Progress(4, enabled=True, label="eval", stderr=True) as bar:
        for done in (1, 2):
            time.sleep(0.05)
            bar.update(done, f"arith: greedy 0.{done}")
        task = bar.bar.tasks[0]
        assert task.completed == 2 and task.time_remaining is not None and task.time_remaining > 0
    err = capsys.readouterr().err
    assert "eval" in err and "2/4" in err and "arith: greedy 0.2" in err and "ETA" in err


def test_no_bar_when_the_stream_is_not_a_terminal(capsys):
    with Progress(2, enabled=None, label="pretrain", stderr=True) as bar:
        bar.update(2, "loss 1.0")
    assert bar.bar is None and capsys.readouterr().err == ""


def test_pretrain_shows_a_bar_on_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    spec = PretrainSpec(steps=3, batch_size=4, hidden_size=16, layers=1, heads=2)
    pretrain(spec, tmp_path / "m", log=lambda *a: None)
    err = capsys.readouterr().err
    assert "pretrain" in err and "3/3" in err and "loss" in err and "ETA" in err


def test_eval_shows_a_bar_on_stderr_and_keeps_json_stdout(tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["eval", str(tiny_model_dir), "--domains", "arith", "--problems", "4", "--samples", "2",
                     "--k", "1,2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(out)) == {"arith"}
    assert "eval" in err and "1/1" in err and "arith: greedy" in err and "ETA" in err
