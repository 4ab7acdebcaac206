"""Alerts (`alerts.jsonl` + console) and spot-check dumps (`samples/step_N.md` + `.jsonl`).

An `Alert` records what a monitor saw and the action configured for it, one of `ALERT_ACTIONS`
(`warn`, `stop`, `rollback`); carrying the action out is the training loop's job, not this module's.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from postrl.monitor.sinks import append_jsonl, read_jsonl, truncate_jsonl
from postrl.registry import Registry

ALERTS_FILE = "alerts.jsonl"
SAMPLES_DIR = "samples"
ALERT_ACTIONS = Registry("alert action")
"""Action name -> the console style its alerts print in. The config keys naming one are
`monitor.NAME.action` and `eval.seesaw_action`; the loop carries them out:
warn (log only), stop (checkpoint and end the run), rollback (back to the last checkpoint)."""
ALERT_ACTIONS.add("warn", "yellow")
ALERT_ACTIONS.add("stop", "bold red")
ALERT_ACTIONS.add("rollback", "bold magenta")


@dataclass
class Alert:
    step: int
    name: str
    """Monitor that raised it, e.g. 'entropy_collapse'."""
    message: str
    """One line for a person: what was seen, against which threshold."""
    action: str = "warn"
    """warn | stop | rollback, from the monitor's config."""
    data: dict[str, float] = field(default_factory=dict)
    """The numbers behind the message (non-finite values are stored as null)."""


class AlertLog:
    """Appends alerts to `run_dir/alerts.jsonl` and prints each on the console."""

    def __init__(self, run_dir: str | Path, console: Console | None = None, resume_step: int | None = None):
        self.path = Path(run_dir) / ALERTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.console = console if console is not None else Console(stderr=True)
        if resume_step is not None:  # steps from resume_step on run again and re-raise their alerts
            truncate_jsonl(self.path, lambda r: isinstance(r.get("step"), int) and r["step"] < resume_step)

    def record(self, alerts: Sequence[Alert]) -> None:
        for alert in alerts:
            rec = asdict(alert)
            rec["data"] = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in alert.data.items()}
            append_jsonl(self.path, rec)
            style = ALERT_ACTIONS.get(alert.action) if alert.action in ALERT_ACTIONS else "yellow"
            self.console.print(
                f"[{style}]ALERT[/] step {alert.step} [bold]{escape(alert.name)}[/] "
                f"({escape(alert.action)}): {escape(alert.message)}",
                highlight=False,
            )


def read_alerts(run_dir: str | Path) -> list[Alert]:
    out = []
    for rec in read_jsonl(Path(run_dir) / ALERTS_FILE):
        data = {k: (math.nan if v is None else float(v)) for k, v in (rec.get("data") or {}).items()}
        try:
            out.append(Alert(int(rec["step"]), str(rec["name"]), str(rec["message"]), str(rec["action"]), data))
        except (KeyError, TypeError, ValueError):
            continue  # a record from a foreign or older writer; the report shows what it can
    return out


# ---------------------------------------------------------------------------- spot checks


@dataclass
class SpotCheck:
    kind: str
    """highest | lowest | random."""
    domain: str
    task_id: str
    group: int
    reward: float | None
    correct: bool | None
    status: str | None
    components: dict[str, float]
    detail: str
    finish_reason: str
    prompt: str
    answer: str
    completion: str
    turns: list[dict] | None = None
    """A multi-turn episode's whole transcript ({role, text, tokens, tool, status, seconds}); None: single turn."""
    end_reason: str = ""


def _spot(kind: str, s) -> SpotCheck:
    score = s.score
    episode = s.episode
    return SpotCheck(
        kind=kind,
        domain=s.task.domain,
        task_id=s.task.task_id,
        group=s.group,
        reward=None if score is None else score.reward,
        correct=None if score is None else score.correct,
        status=None if score is None else score.status,
        components={} if score is None else dict(score.components),
        detail="" if score is None else score.detail,
        finish_reason=s.finish_reason,
        prompt=s.task.prompt,
        answer=s.task.answer,
        completion=s.text,
        turns=None if episode is None else [asdict(t) for t in episode.turns],
        end_reason="" if episode is None else episode.end_reason,
    )


def pick_spot_checks(samples: Sequence, k: int, seed: int) -> list[SpotCheck]:
    """Up to k highest-reward, k lowest-reward and k random others, without repeats."""
    order = sorted(range(len(samples)), key=lambda i: (samples[i].reward, i))
    top = order[::-1][:k]
    low = [i for i in order if i not in top][:k]
    rest = [i for i in range(len(samples)) if i not in top and i not in low]
    # A private RNG: spot checks must not shift the training RNG streams (exact resume).
    rand = random.Random(seed).sample(rest, min(k, len(rest)))
    picks = [("highest", i) for i in top] + [("lowest", i) for i in low] + [("random", i) for i in rand]
    return [_spot(kind, samples[i]) for kind, i in picks]


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _markdown(step: int, picks: list[SpotCheck]) -> str:
    lines = [f"# Spot check, step {step}", ""]
    for n, p in enumerate(picks, 1):
        terms = ", ".join(f"{k}={v:.4g}" for k, v in p.components.items()) or "none"
        reward = "unscored" if p.reward is None else f"{p.reward:.4g}"
        lines += [
            f"## {n}. {p.kind} reward: {reward} ({p.domain} / {p.task_id}, group {p.group})",
            "",
            f"- correct: {p.correct}, verifier status: {p.status}, finish: {p.finish_reason}",
            f"- reward terms: {terms}",
            f"- expected answer: {p.answer}",
        ]
        if p.detail:
            lines.append(f"- verifier note: {p.detail}")
        shown = [("prompt", p.prompt)]
        if p.turns is None:
            shown.append(("completion", p.completion))
        else:  # the whole transcript, turn by turn
            lines.append(f"- episode: {sum(t['role'] == 'assistant' for t in p.turns)} assistant turns, "
                         f"ended: {p.end_reason}")
            shown += [(_turn_label(t), t["text"]) for t in p.turns]
        for label, text in shown:
            fence = _fence(text)
            lines += ["", f"{label}:", "", fence, text, fence]
        lines.append("")
    return "\n".join(lines)


def _turn_label(turn: dict) -> str:
    about = [f"{turn['tokens']} tokens", f"{turn['seconds']:.2f}s"]
    if turn["tool"]:
        about.insert(0, f"tool {turn['tool']}" + (f", {turn['status']}" if turn["status"] else ""))
    return f"{turn['role']} ({'; '.join(about)})"


def dump_samples(run_dir: str | Path, step: int, samples: Sequence, k: int = 3, seed: int = 0) -> Path:
    """Write `samples/step_N.md` (to read) and `samples/step_N.jsonl` (to grep); returns the .md path."""
    picks = pick_spot_checks(samples, k, seed=seed * 1_000_003 + step)
    out = Path(run_dir) / SAMPLES_DIR
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"step_{step}.md"
    md.write_text(_markdown(step, picks), encoding="utf-8")
    with open(out / f"step_{step}.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(_record(p), ensure_ascii=False) + "\n" for p in picks)
    return md


def _record(p: SpotCheck) -> dict:
    """A spot check as a JSON line; single-turn samples keep the fields they always had."""
    out = asdict(p)
    if p.turns is None:
        del out["turns"], out["end_reason"]
    return out
