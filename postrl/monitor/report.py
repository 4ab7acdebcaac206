"""`report.html`: one self-contained page per run (plots as inline SVG images, no other files).

    path = write_report("runs/demo")        # -> runs/demo/report.html

Reads `metrics.jsonl`, `alerts.jsonl`, `eval/*.json`, `config.yaml` and lists `samples/`. Each
plot in `PLOTS` is drawn when at least one of its metrics was logged, and named under "Not
plotted" otherwise, so a run with a few steps or a partial set of metrics still renders. Alerts
are vertical lines on every timeline, coloured by action, and listed in a table.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from postrl.errors import UserError
from postrl.monitor.alerts import ALERTS_FILE, SAMPLES_DIR, Alert, read_alerts
from postrl.monitor.sinks import METRICS_FILE, read_metrics
from postrl.monitor.svgplot import Line, VLine, line_plot

REPORT_FILE = "report.html"
EVAL_DIR = "eval"
_ACTION_COLOUR = {"warn": "#e69f00", "stop": "#d55e00", "rollback": "#cc79a7"}


@dataclass(frozen=True)
class PlotSpec:
    title: str
    ylabel: str
    names: tuple[str, ...] = ()
    """Exact metric names drawn."""
    prefixes: tuple[str, ...] = ()
    """Every metric whose name starts with one of these is drawn too (per-domain series)."""

    def series(self, available: set[str]) -> list[str]:
        picked = [n for n in self.names if n in available]
        picked += sorted(n for n in available if n.startswith(self.prefixes) and n not in picked)
        return picked


# Order is the page order. Names are the stable metric names of postrl.monitor.sinks.
PLOTS: list[PlotSpec] = [
    PlotSpec("Reward per domain", "mean reward", ("reward/mean",), ("reward/",)),
    PlotSpec("Pass rate per domain", "share correct", ("pass_rate",), ("pass_rate/",)),
    PlotSpec("KL to reference", "nats / token", ("kl/mean", "kl/max")),
    PlotSpec("KL coefficient", "coefficient", ("kl/coef",)),
    PlotSpec("Entropy", "nats / token", ("entropy",), ("entropy/",)),
    PlotSpec("Response length", "tokens", ("response_len/mean",)),
    PlotSpec("Clip fraction", "share of tokens clipped", ("clip_frac",)),
    PlotSpec("Throughput", "sampled tokens / s", ("tokens_per_s",)),
    PlotSpec("Time per stage", "seconds", ("time/sample_s", "time/reward_s", "time/update_s"), ("time/",)),
    PlotSpec("Train/inference mismatch", "nats", ("mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max",
                                                   "mismatch/kl_k3")),
    PlotSpec("Rollout correction", "weight / share", (), ("rollout_correction/",)),
    PlotSpec("Loss", "loss", ("loss", "pg_loss")),
    PlotSpec("Gradient norm", "norm before clipping", ("grad_norm",)),
    PlotSpec("Learning rate", "lr", ("lr",)),
    PlotSpec("Curriculum weights", "sampling weight", (), ("curriculum/weight/",)),
    PlotSpec("Batch composition", "share of the step's samples", (), ("batch/",)),
    PlotSpec("Unverified samples", "share not verified (timeout/error)", ("verifier/unverified",)),
    PlotSpec("Monitor signals", "statistic", (), ("monitor/",)),
]
EVAL_PLOT_TITLE = "Held-out evaluation"


@dataclass
class EvalResult:
    label: str
    """File stem, e.g. 'step_20' or 'final'."""
    step: int | None
    results: dict[str, dict[str, float]]
    """{domain: {"greedy": x, "pass@1": x, ...}}."""


@dataclass
class RunData:
    run_dir: Path
    metrics: dict[int, dict[str, float]]
    alerts: list[Alert]
    evals: list[EvalResult]
    config_text: str | None
    spot_checks: list[str]
    """Paths of spot-check files relative to the run directory."""


def read_evals(run_dir: Path) -> list[EvalResult]:
    out = []
    for path in sorted((run_dir / EVAL_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a torn file from a killed eval is not worth failing the report over
        if not isinstance(data, dict):
            continue
        m = re.fullmatch(r"step_(\d+)", path.stem)
        results = {
            str(d): {str(k): float(v) for k, v in r.items() if isinstance(v, (int, float))}
            for d, r in data.items() if isinstance(r, dict)
        }
        out.append(EvalResult(path.stem, int(m.group(1)) if m else None, results))
    # Numbered evals by step, then named ones (final, ...) by name.
    return sorted(out, key=lambda e: (e.step is None, e.step if e.step is not None else 0, e.label))


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    markers = [run_dir / METRICS_FILE, run_dir / ALERTS_FILE, run_dir / EVAL_DIR]
    if not any(p.exists() for p in markers):
        raise UserError(f"{run_dir} does not look like a run directory (no {METRICS_FILE}, {ALERTS_FILE} or {EVAL_DIR}/)")
    config = run_dir / "config.yaml"
    samples = run_dir / SAMPLES_DIR
    spot = sorted(samples.glob("step_*.md"), key=lambda p: int(p.stem[5:]) if p.stem[5:].isdigit() else -1)
    return RunData(
        run_dir=run_dir,
        metrics=read_metrics(run_dir),
        alerts=read_alerts(run_dir),
        evals=read_evals(run_dir),
        config_text=config.read_text() if config.is_file() else None,
        spot_checks=[str(p.relative_to(run_dir)) for p in spot],
    )


# ---------------------------------------------------------------------------- drawing


def alert_lines(alerts: list[Alert]) -> list[VLine]:
    """An alert is a vertical line at its step, coloured by its action."""
    return [VLine(a.step, _ACTION_COLOUR.get(a.action, "red"), f"alert ({a.action})") for a in alerts]


def series_svg(title: str, ylabel: str, series: dict[str, list[tuple[int, float]]], alerts: list[Alert]) -> str:
    """A line plot of named (step, value) series with the alerts across it, as SVG text."""
    return line_plot(title, ylabel, [Line(name, points) for name, points in series.items()], alert_lines(alerts))


def metric_series(metrics: dict[int, dict[str, float]], name: str) -> list[tuple[int, float]]:
    return [(step, values[name]) for step, values in metrics.items() if name in values]


def eval_series(evals: list[EvalResult]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for e in evals:
        if e.step is None:
            continue
        for domain, results in e.results.items():
            for key, value in results.items():
                series.setdefault(f"{domain} {key}", []).append((e.step, value))
    return series


@dataclass
class RenderedPlot:
    title: str
    svg: str


def img(plot: RenderedPlot) -> str:
    """The plot as an <img> of an inline SVG data URL (drawn like any image, nothing fetched)."""
    data = base64.b64encode(plot.svg.encode()).decode("ascii")
    return f"<img alt='{html.escape(plot.title)}' src='data:image/svg+xml;base64,{data}'>"


def build_figures(run: RunData) -> tuple[list[RenderedPlot], list[str]]:
    """Figures for the plots that have data, and the titles of those skipped."""
    available = {name for values in run.metrics.values() for name in values}
    figures, skipped = [], []
    for spec in PLOTS:
        names = spec.series(available)
        series = {n: pts for n in names if (pts := metric_series(run.metrics, n))}
        if not series:
            skipped.append(f"{spec.title} (no {', '.join(spec.names + tuple(p + '*' for p in spec.prefixes))})")
            continue
        figures.append(RenderedPlot(spec.title, series_svg(spec.title, spec.ylabel, series, run.alerts)))
    evals = eval_series(run.evals)
    if evals:
        figures.append(RenderedPlot(EVAL_PLOT_TITLE, series_svg(EVAL_PLOT_TITLE, "score", evals, run.alerts)))
    else:
        skipped.append(f"{EVAL_PLOT_TITLE} (no {EVAL_DIR}/step_N.json)")
    return figures, skipped


# ---------------------------------------------------------------------------- page

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1400px}
h1{margin-bottom:.2em} .sub{color:#666;margin-top:0}
table{border-collapse:collapse;margin:.5em 0 1.5em} td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:flex;flex-wrap:wrap;gap:12px} figure.plot{margin:0;border:1px solid #ddd;padding:6px}
figure.plot h3{margin:.2em 0;font-size:1em} .warn{color:#b07000} .stop,.rollback{color:#b03000}
pre{background:#f7f7f7;padding:1em;overflow:auto}
"""


HEAD = "<!doctype html><html><head><meta charset='utf-8'><link rel=icon href='data:,'>"
"""Page head; the empty data: icon keeps a browser from asking for a favicon that is not there."""


def fmt_number(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def html_table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f"<td{' class=num' if i >= numeric_from else ''}>{c}</td>" for i, c in enumerate(r)
        ) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def eval_table(evals: list[EvalResult]) -> str:
    if not evals:
        return "<p>No eval results (eval/*.json).</p>"
    keys = sorted({k for e in evals for r in e.results.values() for k in r}, key=lambda k: (k != "greedy", k))
    rows = [
        [html.escape(e.label), html.escape(d)] + [fmt_number(r.get(k, math.nan)) for k in keys]
        for e in evals for d, r in sorted(e.results.items())
    ]
    return html_table(["eval", "domain"] + keys, rows, numeric_from=2)


def alerts_table(alerts: list[Alert]) -> str:
    if not alerts:
        return "<p>No alerts.</p>"
    rows = [[str(a.step), html.escape(a.name), f"<span class={html.escape(a.action)}>{html.escape(a.action)}</span>",
             html.escape(a.message)] for a in alerts]
    return html_table(["step", "monitor", "action", "message"], rows, numeric_from=99)


def summary_table(metrics: dict[int, dict[str, float]]) -> str:
    if not metrics:
        return "<p>No metrics logged (metrics.jsonl is missing or empty).</p>"
    last_step = max(metrics)
    keys = [k for k in ("reward/mean", "pass_rate", "kl/mean", "entropy", "response_len/mean", "tokens_per_s")
            if k in metrics[last_step]]
    first = metrics[min(metrics)]
    rows = [[html.escape(k), fmt_number(first.get(k, math.nan)), fmt_number(metrics[last_step][k])] for k in keys]
    return html_table(["metric", f"step {min(metrics)}", f"step {last_step}"], rows)


def render_html(run: RunData) -> str:
    figures, skipped = build_figures(run)
    steps = f"steps {min(run.metrics)}–{max(run.metrics)}" if run.metrics else "no steps logged"
    parts = [
        HEAD,
        f"<title>postrl report: {html.escape(run.run_dir.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>postrl run {html.escape(run.run_dir.name)}</h1>",
        f"<p class=sub>{html.escape(str(run.run_dir))} · {steps} · {len(run.alerts)} alert(s)</p>",
        "<h2>Summary</h2>", summary_table(run.metrics),
        "<h2>Alerts</h2>", alerts_table(run.alerts),
        "<h2>Eval results</h2>", eval_table(run.evals),
        "<h2>Plots</h2><div class=grid>",
    ]
    parts += [f"<figure class=plot><h3>{html.escape(f.title)}</h3>{img(f)}</figure>" for f in figures]
    parts.append("</div>")
    if skipped:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in skipped)
        parts.append(f"<h2>Not plotted</h2><p>These plots had no data in this run:</p><ul>{items}</ul>")
    if run.spot_checks:
        links = "".join(f"<li><a href='{html.escape(p)}'>{html.escape(p)}</a></li>" for p in run.spot_checks)
        parts.append(f"<h2>Spot checks</h2><ul>{links}</ul>")
    if run.config_text is not None:
        parts.append(f"<h2>Config</h2><details><summary>config.yaml</summary><pre>{html.escape(run.config_text)}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render the run's report to `out` (default RUN_DIR/report.html), atomically; returns the path."""
    run = load_run(run_dir)
    path = Path(out) if out is not None else run.run_dir / REPORT_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render_html(run), encoding="utf-8")
    os.replace(tmp, path)
    return path
