"""report.html and the comparison page opened in a real headless Chromium (Debian's `chromium`,
installed by `make setup`), driven by Playwright: no console errors, no request leaving the page,
every plot present, decoded and drawn (not blank), and a screenshot of the first screen."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from postrl import cli
from postrl.monitor.compare import CURVES
from postrl.monitor.report import EVAL_PLOT_TITLE, PLOTS, write_report
from postrl.monitor.sinks import make_sinks

CHROMIUM = Path(os.environ.get("POSTRL_CHROMIUM", "/usr/bin/chromium"))
pytestmark = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason=f"{CHROMIUM} is missing: `make setup` installs Debian's chromium as root (apt-get install chromium)",
)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install -e '.[tracking]'")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DOMAINS = ("arith", "code")

# For every <img> of a plot: loaded, its size, and how many of its pixels are not the background
# (drawn into a canvas; a blank or undecodable image has none).
PLOT_PIXELS = """() => [...document.querySelectorAll('figure.plot')].map(fig => {
  const img = fig.querySelector('img'), title = fig.querySelector('h3')?.textContent;
  if (!img) return {title, ok: false};
  const box = img.getBoundingClientRect();
  const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
  const px = c.width && c.height ? ctx.getImageData(0, 0, c.width, c.height).data : [];
  let ink = 0; for (let i = 0; i < px.length; i += 4) if (px[i] + px[i+1] + px[i+2] < 600) ink++;
  return {title, ok: img.complete, w: img.naturalWidth, h: img.naturalHeight, shown: box.width * box.height,
          ink: ink / Math.max(1, c.width * c.height)};
})"""


def make_run(root: Path, name: str, offset: float, lr: str) -> Path:
    run = root / name
    sinks = make_sinks(run, [])
    for step in range(6):
        m = {"reward/mean": offset + 0.05 * step, "pass_rate": offset / 2 + 0.04 * step, "kl/mean": 0.01 * step,
             "kl/max": 0.03 * step, "kl/coef": 0.01, "entropy": 1.2 - 0.05 * step - offset,
             "response_len/mean": 10.0 + step, "clip_frac": 0.02, "tokens_per_s": 800.0 + step,
             "time/sample_s": 1.0, "time/reward_s": 0.2, "time/update_s": 0.7, "loss": 0.5, "pg_loss": 0.4,
             "grad_norm": 1.0, "lr": 1e-4, "verifier/unverified": 0.0, "monitor/format_share": 0.1,
             "mismatch/logp_abs_diff_mean": 1e-6, "mismatch/logp_abs_diff_max": 4e-5, "mismatch/kl_k3": 0.0,
             "rollout_correction/weight_mean": 1.0}
        for i, d in enumerate(DOMAINS):
            m |= {f"reward/{d}": offset + 0.1 * i, f"pass_rate/{d}": offset + 0.05 * step * (i + 1),
                  f"entropy/{d}": 1.0, f"curriculum/weight/{d}": 0.5, f"batch/{d}": 0.5}
        sinks.log(step, m)
    sinks.close()
    (run / "eval").mkdir()
    for step in (3, 6):
        (run / "eval" / f"step_{step}.json").write_text(json.dumps(
            {d: {"greedy": offset + 0.02 * step, "pass@1": offset + 0.01 * step, "pass@4": offset + 0.03 * step}
             for d in DOMAINS}))
    (run / "config.yaml").write_text(f"seed: 0\ntrain:\n  lr: {lr}\n  total_steps: 6\n")
    return run


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def open_page(browser, path: Path, shot: Path) -> tuple[list[dict], list[str]]:
    """Load `path`; returns the plots' pixel facts and every problem seen: console errors, page
    errors, failed requests, and any request to something other than the page itself or data:."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    page.on("request", lambda r: None if r.url.startswith("data:") or r.url == path.as_uri()
            else problems.append(f"request to {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    plots = page.evaluate(PLOT_PIXELS)
    page.screenshot(path=str(shot))  # the first screen, as a reader sees it
    page.close()
    return plots, problems


def assert_drawn(plots: list[dict], titles: list[str]) -> None:
    assert [p["title"] for p in plots] == titles
    for p in plots:
        assert p["ok"] and p["w"] > 200 and p["h"] > 100 and p["shown"] > 0, p
        assert 0.01 < p["ink"] < 0.5, p  # axes, lines and text drawn; not an empty or black image


def assert_screenshot(shot: Path) -> None:
    from PIL import Image

    img = Image.open(shot).convert("L")
    assert img.size == (1280, 900)
    assert sum(1 for n in img.histogram() if n) > 16  # text and plots, not a blank or error page
    if os.environ.get("POSTRL_SCREENSHOTS"):  # README images: POSTRL_SCREENSHOTS=docs pytest this file
        (Path(os.environ["POSTRL_SCREENSHOTS"]) / shot.name).write_bytes(shot.read_bytes())


def test_report_renders_in_chromium(browser, tmp_path):
    run = make_run(tmp_path, "demo", 0.3, "1e-4")
    path = write_report(run)
    plots, problems = open_page(browser, path, tmp_path / "report.png")
    assert problems == []
    assert_drawn(plots, [s.title for s in PLOTS] + [EVAL_PLOT_TITLE])
    assert_screenshot(tmp_path / "report.png")


def test_comparison_renders_in_chromium(browser, tmp_path, monkeypatch, capsys):
    a, b = make_run(tmp_path, "lr-1e-4", 0.3, "1e-4"), make_run(tmp_path, "lr-3e-4", 0.4, "3e-4")
    out = tmp_path / "compare.html"
    monkeypatch.setattr(cli, "COMMANDS", ["report"])
    assert cli.main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    plots, problems = open_page(browser, out, tmp_path / "compare.png")
    assert problems == []
    titles = [t for t, _, _ in CURVES] + [f"Pass rate: {d}" for d in DOMAINS] + [f"Eval: {d}" for d in DOMAINS]
    assert_drawn(plots, titles)
    assert_screenshot(tmp_path / "compare.png")
