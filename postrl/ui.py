"""Console progress for long loops: a rich progress bar with elapsed time and an ETA.

    with Progress(total_steps, label="train") as bar:      # the training loop: live pass rate etc.
        bar.advance(step, metrics)
    with Progress(n, label="pretrain", stderr=True) as bar:  # anything else: a count and a short text
        bar.update(done, "loss 1.23")

The ETA is rich's: remaining units times the recent average time per unit. `enabled=None` shows
the bar only when its stream is a terminal, so logs, pipes and tests get no bar output.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


def train_stats(metrics: dict[str, float]) -> str:
    return (
        f"pass {metrics.get('pass_rate', 0):.2f}  reward {metrics.get('reward/mean', 0):.2f}  "
        f"kl {metrics.get('kl/mean', 0):.4f}  ent {metrics.get('entropy', 0):.2f}"
    )


class Progress:
    def __init__(self, total: int, enabled: bool | None = True, label: str = "train", stderr: bool = False):
        stream = sys.stderr if stderr else sys.stdout
        self.total, self.label, self.stderr = total, label, stderr
        self.enabled = stream.isatty() if enabled is None else enabled
        self.bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self.bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(stderr=self.stderr),
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, stats="")
        return self

    def advance(self, step: int, metrics: dict[str, float]) -> None:
        """Training: step `step` is done; show its headline metrics."""
        self.update(step + 1, train_stats(metrics))

    def update(self, done: int, text: str = "") -> None:
        """`done` of `total` units are finished; `text` is shown beside the bar."""
        if self.bar is not None:
            self.bar.update(self.task, completed=done, stats=text)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
