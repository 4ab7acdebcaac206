"""report.html from synthetic run directories: plots (SVG images and titles), alerts, eval table, gaps."""

from __future__ import annotations

import base64
import doctest
import io
import json
import math
import re
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from postrl import cli
from postrl.monitor import svgplot
from postrl.monitor.alerts import Alert, AlertLog, dump_samples
from postrl.monitor.report import EVAL_PLOT_TITLE, PLOTS, series_svg, write_report
from postrl.monitor.sinks import make_sinks

DOMAINS = ("arith", "code")


def step_metrics(step: int) -> dict[str, float]:
    m = {
        "reward/mean": 0.3 + 0.1 * step, "pass_rate": 0.2 + 0.1 * step,
        "kl/mean": 0.01 * step, "kl/max": 0.05 * step, "kl/coef": 0.01,
        "entropy": 1.0 - 0.1 * step, "clip_frac": 0.02, "response_len/mean": 12.0 + step,
        "tokens_per_s": 900.0, "time/sample_s": 1.0, "time/reward_s": 0.2, "time/update_s": 0.8,
        "loss": math.nan if step == 1 else 0.5, "pg_loss": 0.4, "grad_norm": 1.1, "lr": 1e-4,
        "verifier/unverified": 0.0,
        "monitor/format_share": 0.1,
        "mismatch/logp_abs_diff_mean": 1e-6, "mismatch/logp_abs_diff_max": 4e-5, "mismatch/kl_k3": 0.0,
        "rollout_correction/weight_mean": 1.0, "rollout_correction/masked_frac": 0.0,
    }
    for i, d in enumerate(DOMAINS):
        m |= {f"reward/{d}": 0.2 * i + 0.1 * step, f"pass_rate/{d}": 0.1 * i + 0.1 * step,
              f"entropy/{d}": 1.0 - 0.05 * i, f"curriculum/weight/{d}": 0.5 + 0.1 * (i - 0.5) * step,
              f"batch/{d}": 0.5}
    return m


@pytest.fixture
def full_run(tmp_path, make_sample):
    run = tmp_path / "demo"
    sinks = make_sinks(run, [])
    for step in range(2):
        sinks.log(step, step_metrics(step))
    sinks.close()
    AlertLog(run, console=Console(file=io.StringIO())).record(
        [Alert(1, "kl_spike", "kl/mean 0.9 > <max>", "warn"), Alert(1, "non_finite", "non-finite loss=nan", "stop")]
    )
    (run / "eval").mkdir()
    (run / "eval" / "step_1.json").write_text(json.dumps(
        {"arith": {"greedy": 0.5, "pass@1": 0.4, "pass@8": 0.9}, "code": {"greedy": 0.1, "pass@1": 0.05, "pass@8": 0.3}}))
    (run / "eval" / "step_0.json").write_text(json.dumps({"arith": {"greedy": 0.25, "pass@1": 0.2, "pass@8": 0.7}}))
    (run / "config.yaml").write_text("seed: 0\ntrain:\n  total_steps: 2\n")
    dump_samples(run, 1, [make_sample("42"), make_sample("41", reward=0.0)], k=1)
    return run


def _titles(page: str) -> list[str]:
    return re.findall(r"<figure class=plot><h3>(.*?)</h3>", page)


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r"<img [^>]*src='data:image/svg\+xml;base64,([^']+)'", page)]


def test_full_run_has_every_plot_with_title_and_image(full_run):
    path = write_report(full_run)
    assert path == full_run / "report.html"
    page = path.read_text()
    expected = [spec.title for spec in PLOTS] + [EVAL_PLOT_TITLE]
    assert _titles(page) == expected
    images = _images(page)
    assert len(images) == len(expected) == page.count("<img ")
    assert all(ET.fromstring(img).tag == "{http://www.w3.org/2000/svg}svg" for img in images)  # well-formed SVG
    assert "Not plotted" not in page
    for title in ("Reward per domain", "Pass rate per domain", "KL to reference", "Entropy", "Response length",
                  "Clip fraction", "Throughput", "Curriculum weights"):
        assert title in expected


def test_page_is_self_contained_with_alerts_eval_table_and_config(full_run):
    page = write_report(full_run).read_text()
    assert not re.search(r"<(img|script|link)[^>]+(src|href)=['\"](?!data:)", page)  # nothing external
    assert "kl/mean 0.9 &gt; &lt;max&gt;" in page and "non-finite loss=nan" in page
    evals = page.split("<h2>Eval results</h2>")[1].split("<h2>")[0]
    assert re.findall(r"<th>(.*?)</th>", evals) == ["eval", "domain", "greedy", "pass@1", "pass@8"]
    rows = re.findall(r"<tr><td>(step_\d+)</td><td>(\w+)</td>", evals)
    assert rows == [("step_0", "arith"), ("step_1", "arith"), ("step_1", "code")]
    assert "<td class=num>0.9</td>" in evals
    assert "total_steps: 2" in page and "samples/step_1.md" in page


def test_alerts_are_vertical_lines_at_their_steps():
    alerts = [Alert(3, "kl_spike", "m", "warn"), Alert(7, "non_finite", "m", "stop")]
    svg = ET.fromstring(series_svg("KL", "nats", {"kl/mean": [(s, 0.1 * s) for s in range(10)]}, alerts))
    ns = {"s": "http://www.w3.org/2000/svg"}
    lines = svg.findall(".//s:line[@class='alert']", ns)
    assert [ln.find("s:title", ns).text for ln in lines] == ["step 3: alert (warn)", "step 7: alert (stop)"]
    ticks = sorted((int(t.text), float(t.get("x"))) for t in svg.findall("s:text[@text-anchor='middle']", ns)
                   if t.text.isdigit())  # the step axis' labels, where they are drawn
    (a, xa), (b, xb) = ticks[0], ticks[-1]
    assert [float(ln.get("x1")) for ln in lines] == [pytest.approx(xa + (xb - xa) * (s - a) / (b - a), abs=0.1)
                                                     for s in (3, 7)]
    assert all(ln.get("x1") == ln.get("x2") for ln in lines)
    assert svg.findall("s:text", ns)[0].text == "KL"
    assert [t.text for t in svg.findall("s:text[@class='legend']", ns)] == ["kl/mean", "alert (warn)", "alert (stop)"]


def test_a_non_finite_value_breaks_the_curve_and_a_flat_or_single_point_series_still_draws():
    svg = ET.fromstring(series_svg("Loss", "loss", {"loss": [(0, 1.0), (1, math.nan), (2, 0.5), (3, 0.4)]}, []))
    path = svg.find(".//{http://www.w3.org/2000/svg}path").get("d")
    assert path.count("M") == 2 and path.count("L") == 1  # 0 | 2-3: a gap where the loss was nan
    for series in ({"lr": [(0, 1e-4), (1, 1e-4)]}, {"reward": [(0, 0.5)]}):
        svg = series_svg("x", "y", series, [])
        assert "nan" not in svg and "inf" not in svg and ET.fromstring(svg).find(".//{http://www.w3.org/2000/svg}circle") is not None


def test_partial_one_step_run_skips_missing_plots_and_says_so(tmp_path):
    make_sinks(tmp_path, []).log(0, {"reward/mean": 0.5, "loss": 1.0})
    page = write_report(tmp_path).read_text()
    assert _titles(page) == ["Reward per domain", "Loss"]
    assert len(_images(page)) == 2
    skipped = page.split("<h2>Not plotted</h2>")[1]
    assert "KL to reference (no kl/mean, kl/max)" in skipped and "Curriculum weights (no curriculum/weight/*)" in skipped
    assert f"{EVAL_PLOT_TITLE} (no eval/step_N.json)" in skipped
    assert "No alerts." in page and "No eval results" in page


def _cli(monkeypatch, capsys, *argv):
    monkeypatch.setattr(cli, "COMMANDS", ["report"])  # the other commands are not under test here
    rc = cli.main(["report", *map(str, argv)])
    return (rc, *capsys.readouterr())


def test_cli_writes_report_and_prints_path(full_run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "elsewhere.html"
    rc, stdout, _ = _cli(monkeypatch, capsys, full_run, "--out", out)
    assert rc == 0 and stdout.strip() == str(out) and out.read_text().count("<img ") == len(PLOTS) + 1


def test_cli_bad_run_dir_exits_2(tmp_path, monkeypatch, capsys):
    rc, _, err = _cli(monkeypatch, capsys, tmp_path / "missing")
    assert rc == 2 and "run directory not found" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _cli(monkeypatch, capsys, tmp_path)
    assert rc == 2 and "does not look like a run directory" in err


def test_report_from_a_real_two_step_run(tiny_model_dir, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    assert cli.main([
        "train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
        "train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
        "eval.num_problems=8", "eval.samples_per_problem=4", "eval.k=[1,4]", "run.progress=false",
    ]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    titles = _titles(page)
    for title in ("Reward per domain", "Pass rate per domain", "KL to reference", "Entropy", "Response length",
                  "Clip fraction", "Throughput", "Curriculum weights", EVAL_PLOT_TITLE):
        assert title in titles
    assert len(_images(page)) == len(titles)
    assert "<td>step_2</td><td>arith</td>" in page


def test_the_tick_examples_of_the_plots_hold():
    result = doctest.testmod(svgplot)
    assert result.attempted > 0 and result.failed == 0
