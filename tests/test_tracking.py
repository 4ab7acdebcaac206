"""MLflow and W&B sinks against the real packages: a local SQLite tracking store read back with
`MlflowClient`, and W&B in offline mode read back from the run files it writes (the `.wandb`
record log, parsed with wandb's own protobuf messages). No network: both stay on this machine."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import yaml

from postrl import cli
from postrl.monitor.sinks import make_sinks
from postrl.monitor.trackers import IDS_FILE, mlflow_name

mlflow = pytest.importorskip("mlflow", reason="the tracking extra is not installed (pip install -e '.[tracking]')")
wandb = pytest.importorskip("wandb", reason="the tracking extra is not installed (pip install -e '.[tracking]')")
from mlflow.tracking import MlflowClient  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402


@pytest.fixture(autouse=True)
def wandb_offline_here(tmp_path, monkeypatch):
    """W&B offline, with every directory it writes (config, cache, staging) under tmp_path."""
    for var, sub in (("WANDB_CONFIG_DIR", "wb-config"), ("WANDB_CACHE_DIR", "wb-cache"),
                     ("WANDB_DATA_DIR", "wb-data"), ("WANDB_ARTIFACT_DIR", "wb-artifacts")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's stdout capture alone
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# ---------------------------------------------------------------------------- reading W&B's files


def wandb_records(path: Path) -> list:
    """Records of a `.wandb` file: a ':W&B' header, then LevelDB-log framed chunks (32 KiB blocks,
    7-byte chunk headers: crc32, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4) of protobuf Records."""
    data = path.read_bytes()
    if len(data) < 7:
        return []
    assert data[:4] == b":W&B"
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # still being written
            break
        if kind == 0:
            pos += block - pos % block
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def finished_sessions(run_dir: Path, sessions: int, timeout_s: float = 60.0) -> list[list]:
    """The records of each offline session's `.wandb` file, once `sessions` of them hold their exit
    record: wandb-core, a separate process, may still be writing after `finish()` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        records = [wandb_records(f) for f in files]
        done = [recs for recs in records if any(r.WhichOneof("record_type") == "exit" for r in recs)]
        if len(done) >= sessions or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def wandb_history(run_dir: Path, sessions: int = 1) -> tuple[list[str], list[dict], list, list[str]]:
    """(run ids, history rows, config items, artifact types) of every offline run under run_dir/wandb."""
    ids, rows, config, artifacts = [], [], [], []
    for recs in finished_sessions(run_dir, sessions):
        for rec in recs:
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.append(rec.run.run_id)
                config += list(rec.run.config.update)
            elif kind == "config":
                config += list(rec.config.update)
            elif kind == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
            elif kind == "artifact":
                artifacts.append(rec.artifact.type)
    return ids, rows, config, artifacts


def series(rows: list[dict], name: str, step_key: str = "_step") -> list[tuple[int, float]]:
    return [(r[step_key], r[name]) for r in rows if name in r]


# ---------------------------------------------------------------------------- a real run


def _train(argv: list[str]) -> int:
    return cli.main(argv)


def test_a_run_and_its_resume_log_to_one_mlflow_and_one_wandb_run(tiny_model_dir, tmp_path, capsys):
    run_dir, db = tmp_path / "run", tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    common = ["run.progress=false", "checkpoint.every_steps=1", "eval.every_steps=1", "eval.num_problems=4",
              "eval.samples_per_problem=2", "eval.k=[1,2]"]
    assert _train([
        "train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
        "train.total_steps=2", "train.prompts_per_step=2", "train.samples_per_prompt=2",
        "monitor.sinks=[tensorboard,mlflow,wandb]", f"monitor.mlflow.tracking_uri={uri}",
        "monitor.mlflow.experiment=tracking-test", "monitor.wandb.project=postrl-test", *common,
    ]) == 0
    first = capsys.readouterr().out
    ids = json.loads((run_dir / IDS_FILE).read_text())
    mlflow_id, wandb_id = ids["mlflow"]["run_id"], ids["wandb"]["run_id"]
    # where things are: said at the start (before step 0) and again at the end
    head, tail = first.split("eval step 1")[0], first.split("eval step 1")[-1]
    for text in (head, tail):
        assert f"report: {run_dir / 'report.html'}" in text
        assert f"tensorboard --logdir {run_dir / 'tb'}" in text
        assert f"MLflow: run {mlflow_id}" in text and f"W&B: run {wandb_id} (offline)" in text

    assert _train(["train", "--resume", str(run_dir), "train.total_steps=3", *common]) == 0
    assert json.loads((run_dir / IDS_FILE).read_text())["mlflow"]["run_id"] == mlflow_id
    check_mlflow(uri, mlflow_id, run_dir)
    check_wandb(run_dir, wandb_id)


def check_mlflow(uri: str, run_id: str, run_dir: Path) -> None:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tracking-test")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # the resume continued it, no second run
    run = runs[0]
    assert run.info.status == "FINISHED"
    params = run.data.params
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert params["train.prompts_per_step"] == "2" and params["seed"] == str(resolved["seed"])
    assert params["monitor.mlflow.experiment"] == "tracking-test"
    reward = client.get_metric_history(run_id, "reward/mean")
    assert sorted({m.step for m in reward}) == [0, 1, 2]
    logged = {json.loads(line)["step"]: json.loads(line)["reward/mean"]
              for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    assert {m.step: m.value for m in reward} == pytest.approx(logged)
    for name in ("pass_rate", "kl/mean", "entropy", "response_len/mean", "loss"):
        assert client.get_metric_history(run_id, name), name
    evals = client.get_metric_history(run_id, "eval/arith/pass_at_2")
    assert sorted(m.step for m in evals) == [1, 2, 3]  # every eval file once, the final one too
    assert evals[-1].value == pytest.approx(json.loads((run_dir / "eval" / "step_3.json").read_text())["arith"]["pass@2"])
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"report.html", "config.yaml", "model"} <= artifacts
    model_files = {Path(a.path).name for a in client.list_artifacts(run_id, "model")}
    assert {"config.json", "model.safetensors"} <= model_files
    local = Path(client.download_artifacts(run_id, "report.html", str(run_dir.parent)))
    assert local.read_text() == (run_dir / "report.html").read_text()


def check_wandb(run_dir: Path, run_id: str) -> None:
    ids, rows, config, artifacts = wandb_history(run_dir, sessions=2)
    assert set(ids) == {run_id} and len(ids) == 2  # first run and resume: one W&B run id
    reward = series(rows, "reward/mean")
    assert sorted({s for s, _ in reward}) == [0, 1, 2]
    assert series(rows, "eval/arith/pass@2", "eval/step")[-1][0] == 3
    assert {c.key for c in config} >= {"train", "monitor", "seed"}
    assert artifacts.count("report") == 2 and "model" in artifacts


# ---------------------------------------------------------------------------- the sinks alone


def _run_dir(tmp_path: Path, monitor: dict) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"seed": 3, "train": {"lr": 1e-4, "k": [1, 8]},
                                                         "monitor": monitor}))
    return run_dir


def test_mlflow_sink_eval_names_and_resume_adds_only_new_params(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_dir = _run_dir(tmp_path, {"mlflow": {"tracking_uri": uri, "experiment": "e"}})
    sinks = make_sinks(run_dir, ["mlflow"])
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "step_1.json").write_text(json.dumps({"arith": {"pass@8": 0.5, "greedy": 0.25}}))
    sinks.log(1, {"reward/mean": 0.5, "weird name!": 1.0})
    sinks.close()
    run_id = json.loads((run_dir / IDS_FILE).read_text())["mlflow"]["run_id"]
    assert (tmp_path / "mlartifacts").is_dir()  # beside the database, not in the working directory
    # the resume changes a parameter (immutable in MLflow) and adds one
    (run_dir / "config.yaml").write_text((run_dir / "config.yaml").read_text().replace("seed: 3", "seed: 4\nnew: 1"))
    again = make_sinks(run_dir, ["mlflow"], resume_step=2)
    again.log(2, {"reward/mean": 0.75})
    again.close()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params["seed"] == "3" and run.data.params["new"] == "1"
    assert run.data.params["train.k"] == "[1, 8]"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "reward/mean")] == [(1, 0.5), (2, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/arith/pass_at_8")] == [(1, 0.5)]
    assert client.get_metric_history(run_id, "weird name_")[0].value == 1.0
    assert mlflow_name("eval/code/pass@16") == "eval/code/pass_at_16"


def test_wandb_sink_writes_offline_files_with_the_metrics(tmp_path):
    run_dir = _run_dir(tmp_path, {"wandb": {"project": "p", "mode": "offline"}})
    sinks = make_sinks(run_dir, ["wandb"], run_name="demo")
    for step in range(3):
        sinks.log(step, {"reward/mean": 0.25 * step, "kl/mean": 0.01})
    assert any("W&B: run" in line and "(offline)" in line for line in sinks.where())
    sinks.close()
    ids, rows, config, _ = wandb_history(run_dir)
    assert len(ids) == 1
    assert series(rows, "reward/mean") == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert {c.key: json.loads(c.value_json) for c in config}["seed"] == 3


@pytest.mark.parametrize("name", ["mlflow", "wandb"])
def test_a_tracker_without_its_package_says_what_to_install(tmp_path, monkeypatch, name):
    from postrl.errors import UserError

    monkeypatch.setitem(__import__("sys").modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(UserError, match=rf"sink '{name}' needs the {name} package .*postrl\[tracking\]"):
        make_sinks(tmp_path, [name])
