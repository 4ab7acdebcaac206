"""Experiment trackers as metric sinks: MLflow and Weights & Biases.

    monitor:
      sinks: [tensorboard, mlflow, wandb]
      mlflow: {tracking_uri: sqlite:///runs/mlflow.db, experiment: arith}
      wandb: {project: arith, mode: offline}

What each tracker receives:

* every step's metrics at their step (the names of `postrl.monitor.sinks`);
* the resolved config, read from RUN_DIR/config.yaml (the run writes it before it opens its sinks,
  so the tracker holds exactly what took effect): MLflow parameters (dotted keys) and the config
  file as an artifact; W&B's run config;
* held-out eval results (`eval/step_N.json`) as `eval/<domain>/<metric>` series at step N, sent as
  soon as a step's metrics follow the eval (and at close). W&B plots them against `eval/step`;
  MLflow metric names may not hold '@', so `pass@8` is logged there as `pass_at_8`;
* when the sink closes: `report.html` and `config.yaml`, and `final/` (the trained model) when
  `log_model` is on and the run has written it.

Resume: the tracker's run id is kept in RUN_DIR/tracking.json, so `postrl train --resume` continues
the same MLflow run and the same W&B run. Steps from the resume point on were possibly logged
before the interruption; resume is exact, so they come again with the same values: MLflow keeps
both points at the same step, W&B drops steps below its last one.

This module does not know the run or the loop; it imports mlflow and wandb only when a sink is
built (`postrl.monitor.sinks` registers the names and defers to it).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import secrets
import string
import time
from pathlib import Path

import yaml

from postrl.errors import UserError
from postrl.files import write_atomic

IDS_FILE = "tracking.json"
"""{tracker: {"run_id": ..., ...}} of the tracker runs this run directory logs to."""
CONFIG_FILE = "config.yaml"
REPORT_FILE = "report.html"
FINAL_DIR = "final"
EVAL_DIR = "eval"
_ID_CHARS = string.ascii_lowercase + string.digits  # what W&B run ids are made of


def import_optional(module: str, sink: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"sink '{sink}' needs the {module} package (pip install {module}, "
                        "or pip install 'postrl[tracking]')") from None


# ---------------------------------------------------------------------------- run-directory state


def read_ids(run_dir: Path) -> dict[str, dict]:
    path = run_dir / IDS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def save_ids(run_dir: Path, tracker: str, info: dict) -> None:
    """Merge `info` into the tracker's entry of tracking.json, atomically."""
    data = read_ids(run_dir)
    data[tracker] = {**data.get(tracker, {}), **info}
    write_atomic(run_dir / IDS_FILE, json.dumps(data, indent=1))  # read back by --resume


def resolved_config(run_dir: Path) -> dict:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


def section(config: dict, tracker: str) -> dict:
    """The `monitor.<tracker>` settings of a resolved config ({} when absent)."""
    value = (config.get("monitor") or {}).get(tracker) or {}
    return value if isinstance(value, dict) else {}


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 1e-4}} -> {"train.lr": "0.0001"}; lists and scalars as their JSON text."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, name + ".")
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


class EvalFeed:
    """The eval results not yet sent to one tracker; what was sent is remembered in tracking.json,
    so a resumed or reopened sink sends each eval file once."""

    def __init__(self, run_dir: Path, tracker: str):
        self.run_dir, self.tracker = run_dir, tracker
        self.sent: set[str] = set(read_ids(run_dir).get(tracker, {}).get("evals_sent", []))

    def take(self) -> list[tuple[int, dict[str, float]]]:
        """[(step, {"eval/<domain>/<metric>": value})] of eval/step_N.json files not sent yet, by step."""
        new = []
        for path in sorted((self.run_dir / EVAL_DIR).glob("step_*.json")):
            step = path.stem[5:]
            if path.name in self.sent or not step.isdigit():
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written right now: taken next time
            values = {f"eval/{d}/{k}": float(v) for d, r in data.items() if isinstance(r, dict)
                      for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            new.append((int(step), values, path.name))
        new.sort()
        for _, _, name in new:
            self.sent.add(name)
        if new:
            save_ids(self.run_dir, self.tracker, {"evals_sent": sorted(self.sent)})
        return [(step, values) for step, values, _ in new]


# ---------------------------------------------------------------------------- MLflow


_MLFLOW_BAD = re.compile(r"[^\w\-./ :]")


def mlflow_name(name: str) -> str:
    """A metric name MLflow accepts (alphanumerics, _ - . / space :): 'pass@8' -> 'pass_at_8'."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


class MlflowSink:
    """Logs to one MLflow run through `MlflowClient` (no fluent global state)."""

    def __init__(self, run_dir: str | Path, run_name: str = "", resume_step: int | None = None):
        mlflow = import_optional("mlflow", "mlflow")
        self.run_dir = Path(run_dir)
        config = resolved_config(self.run_dir)
        settings = section(config, "mlflow")
        self.uri = settings.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        self.client = mlflow.MlflowClient(tracking_uri=self.uri)
        self.log_model = bool(settings.get("log_model", True))
        self.experiment = settings.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "postrl"
        self.run_id = self._continue() or self._create(run_name, settings.get("artifact_location") or "")
        self._log_params(flatten(config))
        self.evals = EvalFeed(self.run_dir, "mlflow")

    def _continue(self) -> str | None:
        """The run id of tracking.json when it names a live run of this tracking store."""
        known = read_ids(self.run_dir).get("mlflow", {})
        if not known.get("run_id") or known.get("tracking_uri") != self.uri:
            return None
        try:
            self.client.get_run(known["run_id"])
        except Exception:  # deleted, or another store at the same URI: start afresh
            return None
        self.client.update_run(known["run_id"], status="RUNNING")
        return known["run_id"]

    def _create(self, run_name: str, artifact_location: str) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            exp_id = self.client.create_experiment(self.experiment, artifact_location=artifact_location
                                                   or _beside_sqlite(self.uri) or None)
        run = self.client.create_run(exp_id, run_name=run_name or self.run_dir.name,
                                     tags={"postrl.run_dir": str(self.run_dir.resolve())})
        save_ids(self.run_dir, "mlflow", {"run_id": run.info.run_id, "tracking_uri": self.uri,
                                          "experiment_id": exp_id, "evals_sent": []})
        return run.info.run_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        # Parameters are immutable in MLflow: a resumed run adds only the keys it did not have.
        have = self.client.get_run(self.run_id).data.params
        new = [Param(k[:250], v[:6000]) for k, v in params.items() if k[:250] not in have]
        for i in range(0, len(new), 100):  # log_batch takes at most 100 parameters
            self.client.log_batch(self.run_id, params=new[i:i + 100])

    def _log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), now, int(step)) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._log_metrics(step, metrics)
        for eval_step, values in self.evals.take():
            self._log_metrics(eval_step, values)

    def close(self) -> None:
        for eval_step, values in self.evals.take():
            self._log_metrics(eval_step, values)
        for name in (CONFIG_FILE, REPORT_FILE):
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        if self.log_model and (self.run_dir / FINAL_DIR).is_dir():
            self.client.log_artifacts(self.run_id, str(self.run_dir / FINAL_DIR), artifact_path="model")
        self.client.set_terminated(self.run_id, "FINISHED")

    def where(self) -> list[str]:
        return [f"MLflow: run {self.run_id} in experiment '{self.experiment}' at {self.uri} "
                f"(mlflow ui --backend-store-uri {self.uri})"]


def _beside_sqlite(uri: str) -> str:
    """mlartifacts/ next to a sqlite database file, so artifacts do not land in the working directory."""
    if not uri.startswith("sqlite:///"):
        return ""
    db = Path(uri[len("sqlite:///"):])
    return (db.parent / "mlartifacts").resolve().as_uri()


# ---------------------------------------------------------------------------- Weights & Biases


class WandbSink:
    """Logs to one W&B run; `mode: offline` writes it under RUN_DIR/wandb/ for `wandb sync` later."""

    def __init__(self, run_dir: str | Path, run_name: str = "", resume_step: int | None = None):
        wandb = import_optional("wandb", "wandb")
        self.run_dir = Path(run_dir)
        config = resolved_config(self.run_dir)
        settings = section(config, "wandb")
        self.log_model = bool(settings.get("log_model", True))
        known = read_ids(self.run_dir).get("wandb", {})
        run_id = known.get("run_id") or "".join(secrets.choice(_ID_CHARS) for _ in range(8))
        if not known.get("run_id"):
            save_ids(self.run_dir, "wandb", {"run_id": run_id, "evals_sent": []})
        self.run = wandb.init(
            id=run_id, resume="allow", dir=str(self.run_dir), name=run_name or self.run_dir.name,
            project=settings.get("project") or os.environ.get("WANDB_PROJECT") or "postrl",
            entity=settings.get("entity") or None, mode=settings.get("mode") or None,
        )
        self.run.config.update(config, allow_val_change=True)  # a resume may override keys
        self.run.define_metric("eval/step")
        self.run.define_metric("eval/*", step_metric="eval/step")  # evals come between steps: own x-axis
        self.evals = EvalFeed(self.run_dir, "wandb")
        self.last_step: int | None = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=int(step))
        self.last_step = int(step)
        self._log_evals()

    def _log_evals(self) -> None:
        # Into the row of the last step logged (W&B refuses steps below it), on eval/step's axis.
        for eval_step, values in self.evals.take():
            values = {k: v for k, v in values.items() if math.isfinite(v)}
            self.run.log({"eval/step": eval_step, **values}, step=self.last_step)

    def close(self) -> None:
        import wandb

        self._log_evals()
        report = wandb.Artifact(f"report-{self.run.id}", type="report")
        for name in (CONFIG_FILE, REPORT_FILE):
            if (self.run_dir / name).is_file():
                report.add_file(str(self.run_dir / name))
        if report.manifest.entries:
            self.run.log_artifact(report)
        if self.log_model and (self.run_dir / FINAL_DIR).is_dir():
            model = wandb.Artifact(f"model-{self.run.id}", type="model")
            model.add_dir(str(self.run_dir / FINAL_DIR))
            self.run.log_artifact(model)
        self.run.finish()

    def where(self) -> list[str]:
        offline = self.run.settings.mode in ("offline", "dryrun")
        if offline:  # a resumed run adds a directory per session; wandb sync merges them by run id
            return [f"W&B: run {self.run.id} (offline) in {self.run_dir / 'wandb'}; upload with: "
                    f"wandb sync {self.run_dir / 'wandb'}/offline-run-*-{self.run.id}*"]
        return [f"W&B: run {self.run.id} ({self.run.settings.mode}) at {self.run.url or self.run.dir}"]

