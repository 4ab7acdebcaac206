"""Metric sinks: where the loop's per-step scalars go.

    sinks = make_sinks(run_dir, ["tensorboard"], run_name="demo")   # jsonl is always added
    sinks.log(step, {"reward/mean": 0.4, "kl/mean": 0.01})
    sinks.close()

Sinks by registry name: `jsonl` (always: `metrics.jsonl`, one JSON object per line with a
"step" key), `tensorboard` (event files under `tb/`, written with the tensorboard package's own
writer), `mlflow` and `wandb` (`postrl.monitor.trackers`, imported only when named: recipe keys
`monitor.mlflow.*` and `monitor.wandb.*`, else their usual environment variables). A sink may
also have `where() -> list[str]`: lines the run prints at its start and end.

Stable metric names (scripts, the report and the monitors rely on these; add, never rename):

    reward/mean, reward/<domain>           mean scalar reward of the step's samples
    pass_rate, pass_rate/<domain>          share of verified samples judged correct
    kl/mean, kl/max, kl/coef               KL to the reference (per token) and its coefficient
    entropy, entropy/<domain>              mean per-token policy entropy, nats
    clip_frac                              share of tokens whose PPO ratio was clipped
    response_len/mean                      mean completion length, tokens
    tokens_per_s                           sampled tokens per second of sampling time
    time/sample_s, time/reward_s, time/update_s   wall-clock seconds per stage
    time/sync_s                                  weight sync into the sampling backend (in sample_s)
    loss, pg_loss, grad_norm, lr           last optimiser step's loss (total, policy-gradient part),
                                           pre-clip grad norm, learning rate
    verifier/unverified                    share of samples whose verifier timed out or failed
    batch/<domain>                         share of the step's samples drawn from each domain
    curriculum/weight/<domain>             sampling weight of each domain
    monitor/<name>                         the statistic each monitor tested (postrl.monitor.monitors)
    reward_fn/<function>                   a reward function's mean over the samples it applied to
    reward_fn/<function>/<name>            what it logged with TRL's log_metric, averaged over the step

Eval results are not metrics: the loop writes them to `eval/step_N.json` as
`{domain: {"greedy": x, "pass@1": x, "pass@8": x}}`.

In `metrics.jsonl` a non-finite value (NaN, inf) is written as null, so the file stays valid
JSON for any reader. On resume, pass `resume_step` (the first step that will be run again):
`metrics.jsonl` drops lines from that step on, and TensorBoard gets a SessionLog START at that
step, which makes its readers discard the orphaned events of the interrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from postrl.registry import Registry

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Located(Protocol):
    """An optional ability of a sink: says where it logs (a directory, a tracking server's run)."""

    def where(self) -> list[str]: ...


# ---------------------------------------------------------------------------- JSONL helpers


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file; a torn last line (process killed mid-write) is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def truncate_jsonl(path: Path, keep: Callable[[dict], bool]) -> None:
    """Rewrite `path` atomically keeping only the records `keep` accepts."""
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path) if keep(r)]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def read_metrics(run_dir: str | Path) -> dict[int, dict[str, float]]:
    """{step: {name: value}} from `metrics.jsonl`; a step logged twice keeps its last values, null -> NaN."""
    by_step: dict[int, dict[str, float]] = {}
    for rec in read_jsonl(Path(run_dir) / METRICS_FILE):
        if not isinstance(rec.get("step"), int):
            continue
        step = rec.pop("step")
        values = {k: (math.nan if v is None else float(v)) for k, v in rec.items() if v is None or _is_number(v)}
        by_step.setdefault(step, {}).update(values)
    return dict(sorted(by_step.items()))


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---------------------------------------------------------------------------- sinks


SINKS = Registry("metric sink", key="monitor.sinks")
"""Name -> factory(run_dir, run_name=, resume_step=) -> MetricSink."""
register_sink = SINKS.register


@register_sink("jsonl")
class JsonlSink:
    def __init__(self, run_dir: str | Path, run_name: str = "", resume_step: int | None = None):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            truncate_jsonl(self.path, lambda r: isinstance(r.get("step"), int) and r["step"] < resume_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record: dict[str, float | int | None] = {"step": int(step)}
        record.update({k: _finite_or_none(v) for k, v in metrics.items()})
        append_jsonl(self.path, record)

    def close(self) -> None:
        pass

    def where(self) -> list[str]:
        return [f"metrics: {self.path}"]


@register_sink("tensorboard")
class TensorBoardSink:
    def __init__(self, run_dir: str | Path, run_name: str = "", resume_step: int | None = None):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self.logdir = Path(run_dir) / TB_DIR
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir))
        if resume_step is not None:
            # Readers drop events with step >= a START's step that came before it (orphans of the crash).
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=resume_step, session_log=start))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        event = self._event_pb2.Event(wall_time=time.time(), step=int(step), summary=Summary(value=values))
        self._writer.add_event(event)
        self._writer.flush()  # a killed run keeps every logged step

    def close(self) -> None:
        self._writer.close()

    def where(self) -> list[str]:
        return [f"TensorBoard: tensorboard --logdir {self.logdir}"]


@register_sink("mlflow")
def mlflow_sink(run_dir: str | Path, run_name: str = "", resume_step: int | None = None) -> MetricSink:
    """MLflow (postrl.monitor.trackers); mlflow is imported only when a run names this sink."""
    from postrl.monitor.trackers import MlflowSink

    return MlflowSink(run_dir, run_name=run_name, resume_step=resume_step)


@register_sink("wandb")
def wandb_sink(run_dir: str | Path, run_name: str = "", resume_step: int | None = None) -> MetricSink:
    """Weights & Biases (postrl.monitor.trackers); wandb is imported only when a run names this sink."""
    from postrl.monitor.trackers import WandbSink

    return WandbSink(run_dir, run_name=run_name, resume_step=resume_step)


class MultiSink:
    """Fans each call out to several sinks; is itself a `MetricSink`."""

    def __init__(self, sinks: list[MetricSink]):
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def where(self) -> list[str]:
        """One line per sink that says where it logs (sinks without a `where` method say nothing)."""
        return [line for sink in self.sinks if isinstance(sink, Located) for line in sink.where()]


def make_sinks(
    run_dir: str | Path, names: list[str], run_name: str = "", resume_step: int | None = None
) -> MultiSink:
    """The named sinks plus `jsonl` (always first). An unknown name raises ConfigError naming
    `monitor.sinks` and the valid names."""
    ordered = ["jsonl"] + [n for n in dict.fromkeys(names) if n != "jsonl"]
    factories = [SINKS.get(n) for n in ordered]  # every name checked before any sink opens a file
    return MultiSink([f(run_dir, run_name=run_name, resume_step=resume_step) for f in factories])
