"""Console progress for long loops: a rich progress bar with the live pass rate."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, total: int, enabled: bool = True, label: str = "train"):
        self.total, self.enabled, self.label = total, enabled, label
        self.bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self.bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, stats="")
        return self

    def advance(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is None:
            return
        stats = (
            f"pass {metrics.get('pass_rate', 0):.2f}  reward {metrics.get('reward/mean', 0):.2f}  "
            f"kl {metrics.get('kl/mean', 0):.4f}  ent {metrics.get('entropy', 0):.2f}"
        )
        self.bar.update(self.task, completed=step + 1, stats=stats)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
