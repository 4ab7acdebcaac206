"""`compare.html`: several runs side by side on one self-contained page.

    path = write_comparison(["runs/a", "runs/b"], "compare.html")

Three parts, in this order: curves of every run overlaid on one plot per metric (reward, pass
rate, KL, entropy, response length, each domain's pass rate, each domain's eval results), the
eval tables (the last eval of each run, one column per run, then each run's full history), and
the config difference (every key whose value is not the same in all runs). Plots are inline
SVG like `report.html`'s: nothing is loaded from anywhere, so the page works offline.

A run is told apart by its directory name (parent/name when two runs share a name). Colour
says which run, line style which series of that run.
"""

from __future__ import annotations

import html
import json
import math
import os
from itertools import cycle
from pathlib import Path

import yaml

from postrl.errors import UserError
from postrl.monitor.report import (
    CSS,
    HEAD,
    EvalResult,
    RenderedPlot,
    RunData,
    eval_table,
    fmt_number,
    html_table,
    img,
    load_run,
    metric_series,
)
from postrl.monitor.svgplot import PALETTE, Line, line_plot

COMPARE_FILE = "compare.html"
STYLES = ("", "6 3", "2 3", "8 3 2 3")
"""Solid, dashed, dotted, dash-dot (SVG stroke-dasharray)."""
# (title, y label, metric) of the overlaid curves; per-domain pass rates and evals follow them.
CURVES = [
    ("Reward", "mean reward", "reward/mean"),
    ("Pass rate", "share correct", "pass_rate"),
    ("KL to reference", "nats / token", "kl/mean"),
    ("Entropy", "nats / token", "entropy"),
    ("Response length", "tokens", "response_len/mean"),
]


def run_labels(runs: list[RunData]) -> list[str]:
    names = [r.run_dir.name for r in runs]
    return [f"{r.run_dir.parent.name}/{r.run_dir.name}" if names.count(r.run_dir.name) > 1 else r.run_dir.name
            for r in runs]


Lines = dict[tuple[str, str], list[tuple[int, float]]]
"""(run label, series name) -> (step, value) points."""


def overlay_svg(title: str, ylabel: str, lines: Lines, labels: list[str]) -> str:
    """One plot, a colour per run, a line style per series; SVG text."""
    colour = dict(zip(labels, cycle(PALETTE)))
    style = dict(zip(sorted({name for _, name in lines}), cycle(STYLES)))
    return line_plot(title, ylabel, [Line(label if len(style) == 1 else f"{label}: {name}", points, colour[label],
                                          style[name]) for (label, name), points in lines.items()])


def eval_lines(runs: list[RunData], labels: list[str], domain: str) -> Lines:
    lines: Lines = {}
    for run, label in zip(runs, labels):
        for e in run.evals:
            if e.step is None or domain not in e.results:
                continue
            for key, value in e.results[domain].items():
                if key.startswith("pass@") or key == "greedy":
                    lines.setdefault((label, key), []).append((e.step, value))
    return lines


def compare_figures(runs: list[RunData], labels: list[str]) -> tuple[list[RenderedPlot], list[str]]:
    """The overlaid plots that have data in at least one run, and the titles of those that do not."""
    specs = list(CURVES)
    names = {n for r in runs for values in r.metrics.values() for n in values}
    specs += [(f"Pass rate: {n[len('pass_rate/'):]}", "share correct", n)
              for n in sorted(names) if n.startswith("pass_rate/")]
    figures, skipped = [], []
    for title, ylabel, metric in specs:
        lines = {(label, metric): pts for run, label in zip(runs, labels) if (pts := metric_series(run.metrics, metric))}
        if lines:
            figures.append(RenderedPlot(title, overlay_svg(title, ylabel, lines, labels)))
        else:
            skipped.append(f"{title} (no {metric} in any run)")
    domains = sorted({d for r in runs for e in r.evals for d in e.results})
    for domain in domains:
        title = f"Eval: {domain}"
        lines = eval_lines(runs, labels, domain)
        if lines:
            figures.append(RenderedPlot(title, overlay_svg(title, "score", lines, labels)))
    if not domains:
        skipped.append("Eval per domain (no eval/step_N.json in any run)")
    return figures, skipped


# ---------------------------------------------------------------------------- tables


def last_eval(run: RunData) -> EvalResult | None:
    """The run's final eval: the highest step, else a named one (final, ...)."""
    numbered = [e for e in run.evals if e.step is not None]
    return numbered[-1] if numbered else (run.evals[-1] if run.evals else None)


def eval_side_by_side(runs: list[RunData], labels: list[str]) -> str:
    finals = [last_eval(r) for r in runs]
    rows_keys = sorted({(d, k) for e in finals if e for d, r in e.results.items() for k in r
                        if k.startswith("pass@") or k == "greedy"}, key=lambda dk: (dk[0], dk[1] != "greedy", dk[1]))
    if not rows_keys:
        return "<p>No eval results in any run.</p>"
    header = ["domain", "metric"] + [f"{label} ({e.label if e else 'no eval'})" for label, e in zip(labels, finals)]
    rows = [[html.escape(d), html.escape(k)] + [fmt_number(e.results.get(d, {}).get(k, math.nan) if e else math.nan)
                                                for e in finals] for d, k in rows_keys]
    return html_table(header, rows, numeric_from=2)


def flat_config(run: RunData) -> dict[str, str]:
    """Dotted key -> value (as YAML text) of the run's config.yaml ({} when it has none)."""
    if run.config_text is None:
        return {}
    try:
        tree = yaml.safe_load(run.config_text)
    except yaml.YAMLError:
        return {"config.yaml": "(unreadable)"}
    out: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = json.dumps(node) if not isinstance(node, str) else node

    walk(tree if isinstance(tree, dict) else {}, "")
    return out


def config_diff(runs: list[RunData], labels: list[str]) -> str:
    configs = [flat_config(r) for r in runs]
    keys = sorted(set().union(*configs))
    differ = [k for k in keys if len({c.get(k, "\0absent") for c in configs}) > 1]
    if not differ:
        return f"<p>The {len(runs)} configs are identical ({len(keys)} keys).</p>"
    rows = [[f"<code>{html.escape(k)}</code>"] + [html.escape(c[k]) if k in c else "<i>absent</i>" for c in configs]
            for k in differ]
    note = f"<p>{len(differ)} of {len(keys)} keys differ; the rest are the same in every run.</p>"
    return note + html_table(["key"] + labels, rows, numeric_from=99)


def summary(runs: list[RunData], labels: list[str]) -> str:
    rows = []
    for run, label in zip(runs, labels):
        last = run.metrics[max(run.metrics)] if run.metrics else {}
        steps = f"{min(run.metrics)}–{max(run.metrics)}" if run.metrics else "none"
        rows.append([html.escape(label), steps, str(len(run.alerts))]
                    + [fmt_number(last.get(m, math.nan)) for _, _, m in CURVES])
    return html_table(["run", "steps", "alerts"] + [f"last {m}" for _, _, m in CURVES], rows, numeric_from=2)


def render_comparison(runs: list[RunData]) -> str:
    labels = run_labels(runs)
    figures, skipped = compare_figures(runs, labels)
    parts = [
        HEAD, f"<title>postrl comparison: {html.escape(' vs '.join(labels))}</title><style>{CSS}</style></head><body>",
        f"<h1>postrl: {html.escape(' vs '.join(labels))}</h1>",
        "<p class=sub>" + " · ".join(html.escape(str(r.run_dir)) for r in runs) + "</p>",
        "<h2>Runs</h2>", summary(runs, labels),
        "<h2>Curves</h2><div class=grid>",
    ]
    parts += [f"<figure class=plot><h3>{html.escape(f.title)}</h3>{img(f)}</figure>" for f in figures]
    parts.append("</div>")
    if skipped:
        parts.append("<h2>Not plotted</h2><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in skipped) + "</ul>")
    parts += ["<h2>Eval</h2><h3>Last eval of each run</h3>", eval_side_by_side(runs, labels)]
    parts += [f"<details><summary>every eval of {html.escape(label)}</summary>{eval_table(run.evals)}</details>"
              for run, label in zip(runs, labels)]
    parts += ["<h2>Config difference</h2>", config_diff(runs, labels), "</body></html>"]
    return "\n".join(parts)


def write_comparison(run_dirs: list[str | Path], out: str | Path = COMPARE_FILE) -> Path:
    """Render the comparison of `run_dirs` (two or more) to `out`, atomically; returns the path."""
    if len(run_dirs) < 2:
        raise UserError("a comparison needs at least two run directories")
    runs = [load_run(d) for d in run_dirs]
    path = Path(out)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render_comparison(runs), encoding="utf-8")
    os.replace(tmp, path)
    return path
