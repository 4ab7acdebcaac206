"""Seesaw alerts: joint training's failure where one domain improves while another quietly
regresses. After each evaluation, a domain more than `drop` below its best score so far raises an
alert with the configured action (`eval.seesaw_drop`, `eval.seesaw_action`)."""

from __future__ import annotations

from postrl.monitor.alerts import Alert


def seesaw_alerts(
    best: dict[str, list], scores: dict[str, float], step: int, drop: float, action: str, metric: str = "pass@1",
) -> list[Alert]:
    """Alerts for domains more than `drop` below their best so far; updates `best` in place
    ({domain: [best value, step]}; it lives in the checkpoint). drop 0 = off, bests still kept."""
    out = []
    for domain, value in scores.items():
        prev, prev_step = best.get(domain, (None, None))
        if prev is None or value > prev:
            best[domain] = [value, step]
        elif drop > 0 and prev - value > drop:
            out.append(Alert(
                step, "seesaw",
                f"{domain} {metric} {value:.3f} is {prev - value:.3f} below its best {prev:.3f} (step {prev_step}); "
                f"threshold {drop}",
                action, {"value": value, "best": prev, "drop": prev - value, "best_step": float(prev_step)},
            ))
    return out
