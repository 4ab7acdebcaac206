"""Screenshots of report.html and of a comparison, as the README shows them, taken in headless
Chromium (Debian's, through Playwright's executable_path: `make setup` installs it as root).

    python scripts/report_screenshots.py RUN_A RUN_B --out docs
    # -> docs/report.png (RUN_A's report.html) and docs/compare.png (RUN_A vs RUN_B)

The runs are any two run directories, e.g. the demo recipe at two learning rates:
    postrl train recipes/default.yaml run.dir=runs/lr1e-4 train.total_steps=30 eval.every_steps=10 eval.num_problems=100
    postrl train recipes/default.yaml run.dir=runs/lr3e-4 train.total_steps=30 eval.every_steps=10 eval.num_problems=100 \
        train.lr=3e-4
"""

from __future__ import annotations

import argparse
from pathlib import Path

from postrl.monitor.compare import write_comparison
from postrl.monitor.report import write_report

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    out = Path(args.out)
    pages = {"report.png": write_report(args.run_a),
             "compare.png": write_comparison([args.run_a, args.run_b], out / "compare.html")}
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
        for name, page_path in pages.items():
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(Path(page_path).resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(out / name))
            page.close()
            print(out / name)
        browser.close()
    (out / "compare.html").unlink()


if __name__ == "__main__":
    main()
