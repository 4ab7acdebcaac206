"""Rollout store: schema, atomic shards, truncation for resume, DuckDB queries and the CLI."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from postrl import cli
from postrl.errors import UserError
from postrl.store.query import VIEWS, query, query_view
from postrl.store.rollouts import SCHEMA, RolloutRow, RolloutStore, read_rows, shard_steps

REPO = Path(__file__).resolve().parents[1]


def _step_samples(make_sample, step: int):
    """Two groups of two: group 0 solved once, group 1 never (one verifier timeout)."""
    return [
        make_sample("42", task_id="a", group=0, reward=1.0, correct=True, policy_version=step),
        make_sample("41", task_id="a", group=0, reward=0.0, correct=False, policy_version=step),
        make_sample("def f(): pass", domain="code", task_id="b", group=1, reward=0.2, correct=False,
                    components={"format": 0.2, "tests": 0.0}, finish_reason="length", policy_version=step),
        make_sample("while True: pass", domain="code", task_id="b", group=1, reward=0.0, correct=None,
                    status="timeout", components={"format": 0.0, "tests": 0.0}, policy_version=step),
    ]


@pytest.fixture
def run_dir(tmp_path, make_sample):
    store = RolloutStore(tmp_path, run="r1")
    for step in range(3):
        store.write(step, _step_samples(make_sample, step))
    return tmp_path


def test_row_dataclass_matches_schema():
    assert [f.name for f in fields(RolloutRow)] == SCHEMA.names


def test_shard_schema_types_and_compression(run_dir):
    path = run_dir / "rollouts" / "step_00000001.parquet"
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    assert schema.field("token_ids").type == pa.list_(pa.int32())
    assert schema.field("behaviour_logprobs").type == pa.list_(pa.float32())
    assert schema.field("reward_components").type == pa.map_(pa.string(), pa.float64())
    assert schema.field("correct").type == pa.bool_()
    assert schema.metadata[b"postrl.schema_version"] == b"1"
    codecs = {pf.metadata.row_group(0).column(i).compression for i in range(pf.metadata.num_columns)}
    assert codecs == {"ZSTD"}
    assert pf.metadata.num_rows == 4


def test_rows_round_trip_every_field(run_dir, make_sample):
    rows = read_rows(run_dir, steps=[2])
    assert [(r.step, r.sample) for r in rows] == [(2, 0), (2, 1), (2, 2), (2, 3)]
    r = rows[2]
    assert (r.run, r.domain, r.task_id, r.level, r.group) == ("r1", "code", "b", 1, 1)
    assert r.policy_version == 2
    assert r.prompt == "prompt of b" and r.answer == "42" and r.prompt_ids == [1, 2, 3]
    assert r.completion == "def f(): pass"
    assert r.token_ids == [ord(c) % 97 for c in "def f(): pass"]
    assert r.behaviour_logprobs == [-0.5] * len(r.token_ids)
    assert (r.reward, r.correct, r.verifier_status) == (0.2, False, "ok")
    assert r.reward_components == {"format": 0.2, "tests": 0.0}
    assert r.finish_reason == "length" and r.temperature == 1.0
    assert r.timings == {"sample_s": 0.25, "reward_s": 0.125}
    assert (rows[3].correct, rows[3].verifier_status) == (None, "timeout")
    original = _step_samples(make_sample, 2)[2]
    back = r.to_sample()
    assert back.task == original.task and back.score == original.score
    assert (back.completion_ids, back.logprobs, back.text) == (original.completion_ids, original.logprobs, original.text)


def test_unscored_sample_is_stored_as_null_not_zero(tmp_path, make_sample):
    RolloutStore(tmp_path).write(0, [make_sample("x", reward=None)])
    (row,) = read_rows(tmp_path)
    assert (row.reward, row.correct, row.verifier_status) == (None, None, None)
    assert row.to_sample().score is None


def test_what_a_reward_function_logged_is_stored_with_the_sample(tmp_path, make_sample):
    sample = make_sample("x", reward=1.0)
    sample.score.logged = {"gold_parsed": "[46, '46']", "n": 3}
    RolloutStore(tmp_path).write(0, [sample, make_sample("y", reward=0.0)])
    rows = read_rows(tmp_path)
    assert [r.reward_logs for r in rows] == ['{"gold_parsed": "[46, \'46\']", "n": 3}', None]
    assert rows[0].to_sample().score.logged == {"gold_parsed": "[46, '46']", "n": 3}
    assert rows[1].to_sample().score.logged == {}


def test_last_step_truncate_and_rewrite(run_dir, make_sample):
    store = RolloutStore(run_dir)
    assert store.last_step() == 2 and shard_steps(run_dir) == [0, 1, 2]
    assert store.truncate_after(0) == [1, 2]
    assert store.last_step() == 0
    store.write(0, [make_sample("only")])
    assert [r.completion for r in read_rows(run_dir)] == ["only"]
    store.truncate_after(None)
    assert store.last_step() is None and read_rows(run_dir) == []


def test_failed_write_leaves_no_shard_and_no_temp(tmp_path, make_sample):
    store = RolloutStore(tmp_path)
    bad = make_sample("x")
    bad.completion_ids = ["not an int"]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        store.write(5, [bad])
    assert list((tmp_path / "rollouts").iterdir()) == []


_KILLED_WRITER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from conftest import build_sample
from postrl.store import rollouts
os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die after fsync, before the rename
rollouts.RolloutStore({run_dir!r}).write(1, [build_sample("new")] * 50)
"""


def test_writer_killed_before_rename_leaves_old_shard_intact(tmp_path, make_sample):
    RolloutStore(tmp_path).write(1, [make_sample("old")])
    code = textwrap.dedent(_KILLED_WRITER.format(tests=str(REPO / "tests"), run_dir=str(tmp_path)))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    leftovers = [p.name for p in (tmp_path / "rollouts").iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1  # the complete-but-unrenamed temp file
    assert [r.completion for r in read_rows(tmp_path)] == ["old"]
    assert query(tmp_path, "SELECT count(*) FROM rollouts").rows == [(1,)]
    RolloutStore(tmp_path)  # the next writer cleans up what the dead one left
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_00000001.parquet"]


def test_query_over_shards(run_dir):
    res = query(run_dir, "SELECT domain, avg(reward) AS r, count(*) AS n FROM rollouts GROUP BY domain ORDER BY domain")
    assert res.columns == ["domain", "r", "n"]
    assert res.rows == [("arith", 0.5, 6), ("code", pytest.approx(0.1), 6)]
    res = query(run_dir, "SELECT reward_components['format'] FROM rollouts WHERE step = 0 AND sample = 2")
    assert res.rows == [(0.2,)]


def test_named_views(run_dir):
    by_step = query_view(run_dir, "pass_rate_by_step")
    assert by_step.columns == ["step", "domain", "samples", "pass_rate", "verified_pass_rate", "mean_reward",
                               "unverified"]
    assert by_step.rows[0] == (0, "arith", 2, 0.5, 0.5, 0.5, 0)
    # code: one wrong, one timeout. pass_rate counts the timeout as not passed (as the loop's metric
    # does); verified_pass_rate leaves it out; unverified counts it.
    assert [r for r in by_step.rows if r[:2] == (0, "code")] == [(0, "code", 2, 0.0, 0.0, 0.1, 1)]
    failures = query_view(run_dir, "top_failures")
    assert [(r[0], r[1], r[2]) for r in failures.rows] == [("code", "b", 6), ("arith", "a", 6)]
    assert query_view(run_dir, "verifier_errors").rows[0][4] == "timeout"
    comps = query_view(run_dir, "reward_components_by_step")
    assert ("format", pytest.approx(0.1)) in [(r[1], r[2]) for r in comps.rows if r[0] == 1]
    for name in VIEWS:  # every view runs
        query_view(run_dir, name)


def test_pass_rate_views_count_unverified_as_not_passed_and_separately(tmp_path, make_sample):
    RolloutStore(tmp_path).write(0, [make_sample("42"), make_sample("?", correct=None, status="error")])
    assert query_view(tmp_path, "pass_rate_by_step").rows == [(0, "arith", 2, 0.5, 1.0, 1.0, 1)]
    assert query_view(tmp_path, "pass_rate_by_domain").rows[0][:4] == ("arith", 2, 0.5, 1.0)


def test_bad_sql_and_missing_rollouts_are_user_errors(run_dir, tmp_path_factory):
    with pytest.raises(UserError, match="query failed") as e:
        query(run_dir, "SELECT nope FROM rollouts")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="no rollouts"):
        query(tmp_path_factory.mktemp("empty"), "SELECT 1")
    with pytest.raises(UserError, match="unknown view"):
        query_view(run_dir, "nope")


def _cli(monkeypatch, capsys, *argv):
    monkeypatch.setattr(cli, "COMMANDS", ["rollouts"])  # the other commands are not under test here
    rc = cli.main(["rollouts", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_formats(run_dir, monkeypatch, capsys):
    sql = "SELECT domain, avg(reward) AS mean_reward FROM rollouts GROUP BY domain ORDER BY domain"
    rc, out, _ = _cli(monkeypatch, capsys, run_dir, "--sql", sql)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["domain", "mean_reward"]
    assert lines[2].split() == ["arith", "0.5"] and lines[-1] == "(2 rows)"
    rc, out, _ = _cli(monkeypatch, capsys, run_dir, "--sql", sql, "--format", "csv")
    assert list(csv.reader(io.StringIO(out)))[:2] == [["domain", "mean_reward"], ["arith", "0.5"]]
    rc, out, _ = _cli(monkeypatch, capsys, run_dir, "--view", "pass_rate_by_domain", "--format", "json")
    records = json.loads(out)
    assert [r["domain"] for r in records] == ["arith", "code"] and records[0]["pass_rate"] == 0.5


def test_cli_errors_exit_2_with_one_line(run_dir, tmp_path_factory, monkeypatch, capsys):
    rc, out, err = _cli(monkeypatch, capsys, run_dir, "--sql", "SELEC 1")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: query failed")
    rc, _, err = _cli(monkeypatch, capsys, tmp_path_factory.mktemp("norun"), "--sql", "SELECT 1")
    assert rc == 2 and "no rollouts" in err
    rc, _, err = _cli(monkeypatch, capsys, run_dir)
    assert rc == 2 and "--sql" in err


def test_replay_trains_on_stored_rollouts(tiny_model_dir, tmp_path, capsys):
    """`pipeline.source=replay:RUN_DIR` trains without sampling, on exactly the stored samples,
    correcting for the policy that produced them."""
    import json

    import torch
    from safetensors.torch import load_file

    from postrl.cli import main
    from postrl.store.rollouts import read_rows

    common = [f"model.name={tiny_model_dir}", "train.total_steps=2", "train.prompts_per_step=4",
              "train.samples_per_prompt=4", "rl.entropy_coef=0.01", "eval.num_problems=4",
              "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false"]
    source = tmp_path / "source"
    assert main(["train", "recipes/default.yaml", f"run.dir={source}", *common]) == 0
    replay = tmp_path / "replay"
    # a different update rule on the same data: 4 minibatches, so the policy versions diverge from
    # the stored ones and the learner must correct for the behaviour policy
    assert main(["train", "recipes/default.yaml", f"run.dir={replay}", f"pipeline.source=replay:{source}",
                 "train.lr=3e-4", *common, "train.minibatches=4"]) == 0

    stored, replayed = read_rows(source), read_rows(replay)
    strip = lambda rows: [(r.step, r.sample, r.completion, r.token_ids, r.reward) for r in rows]  # noqa: E731
    assert strip(replayed) == strip(stored)  # the same data, not a fresh sample
    metrics = [json.loads(x) for x in (replay / "metrics.jsonl").read_text().splitlines()]
    assert metrics[1]["staleness/max"] == (4 - 2) / 4  # version 4 here, 2 in the stored run, 4 updates a step
    assert "offpolicy/is_weight_mean" in metrics[1]
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(replay / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # the stored groups are of 4: replayed as groups of 2 they would mix two problems' rewards in
    # one advantage baseline (16 samples is a multiple of 2, so only the group check sees it)
    mixed = tmp_path / "mixed"
    assert main(["train", "recipes/default.yaml", f"run.dir={mixed}", f"pipeline.source=replay:{source}",
                 *common, "train.samples_per_prompt=2", "train.prompts_per_step=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "whole groups of train.samples_per_prompt = 2" in err[0], err


def test_replay_of_a_run_without_rollouts_is_a_user_error(tiny_model_dir, tmp_path, capsys):
    from postrl.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                 f"pipeline.source=replay:{empty}", "run.progress=false"]) == 2
    assert "no rollouts under" in capsys.readouterr().err
