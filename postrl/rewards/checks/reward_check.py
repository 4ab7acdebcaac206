"""Does a reward agree with people? Human-labelled replies, any reward, Cohen's kappa, and the gate
a recipe puts on a domain.

    tasks, responses, labels = read_labels("labels.jsonl", make_task)   # rows + response + label
    report = agreement_report(scores, labels, threshold=0.5)            # accuracy, kappa, confusion
    check_gates(cfg.domains, domains, cfg.base_dir)                     # UserError below min_kappa

A labels file has one JSON object per line: the columns a task is made from (a dataset domain's
row columns; otherwise `prompt` and an optional `gold`, the reference answer), plus `response`
(the reply judged), `label` (true/false or 1/0) and optionally `finish_reason`. A reply counts as
judged good by the reward when its reward is >= `threshold`. Replies the reward could not verify
(status timeout/error) are listed and left out of the agreement.

A recipe gates a run per domain:

    domains:
      gsm:
        reward_check: {labels: gsm_labels.jsonl, min_kappa: 0.8}

and `postrl train` refuses to start, with one line and exit 2, when the domain's reward (its
verifier and the recipe's reward terms, as training computes it) agrees with the labels less
than that (a NaN kappa fails too). The check runs after the domains are built and before the run
directory is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from postrl.abilities import ReadsRows
from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.rewards.checks.agreement import agreement
from postrl.rewards.jsonl import read_jsonl
from postrl.rewards.scoring import trained_reward

LABEL_FIELDS = ("response", "label", "finish_reason")
"""Columns of a labels row that are not the task's."""


def plain_task(row: dict[str, Any], index: int, domain: str = "labels") -> Task:
    """The task of a labels row that names its prompt (and gold) itself."""
    if not isinstance(row.get("prompt"), str):
        raise ValueError("missing field 'prompt' (text)")
    return Task(domain, f"label-{index}", row["prompt"], str(row.get("gold", "")), meta={"row": row})


def read_labels(path: str | Path, make_task: Callable[[dict, int], Task] = plain_task
                ) -> tuple[list[Task], list[Response], list[bool]]:
    """(tasks, responses, human labels) of a labels file; a bad line raises UserError('FILE:LINE: ...')."""
    tasks: list[Task] = []

    def check(row: dict) -> str | None:
        if row["label"] not in (0, 1):
            return "label must be true/false or 1/0"
        if row.get("finish_reason", "stop") not in ("stop", "length"):
            return "finish_reason must be stop or length"
        try:
            tasks.append(make_task({k: v for k, v in row.items() if k not in LABEL_FIELDS}, len(tasks)))
        except (ValueError, KeyError) as e:
            return str(e).strip("'\"")
        return None

    rows = read_jsonl(path, {"response": str, "label": (bool, int)}, check=check)
    responses = [Response(r["response"], r.get("finish_reason", "stop")) for r in rows]
    return tasks, responses, [bool(r["label"]) for r in rows]


def domain_task_maker(domain) -> Callable[[dict, int], Task]:
    """Rows of a data set domain become its own tasks (its columns); others name prompt and gold."""
    if isinstance(domain, ReadsRows):
        from_row = domain.task_of_row

        def make(row: dict, index: int) -> Task:
            try:
                return from_row(row)
            except Exception as e:  # noqa: BLE001 - the domain's RowError names the column
                message = e.at("").lstrip(": ") if hasattr(e, "at") else str(e)
                raise ValueError(message) from None

        return make
    return lambda row, index: plain_task(row, index, domain.name)


def domain_reward(domain, weights: dict[str, float]) -> Callable[[Sequence[Task], Sequence[Response]], list[Score]]:
    """The reward a run trains on for this domain: its verifier, then the recipe's reward terms."""

    def reward(tasks, responses) -> list[Score]:
        return trained_reward(domain, weights, list(tasks), list(responses))

    return reward


def agreement_report(scores: Sequence[Score], human: Sequence[bool], threshold: float,
                     tasks: Sequence[Task] = (), responses: Sequence[Response] = ()) -> dict:
    """Accuracy, kappa, confusion and the examples to read, of the verified examples."""
    verified = [i for i, s in enumerate(scores) if s.status == "ok"]
    if not verified:
        raise UserError("the reward could not verify any labelled example")
    result = agreement([human[i] for i in verified], [scores[i].reward >= threshold for i in verified])

    def example(i: int) -> dict:
        s = scores[i]
        return {"record": i + 1, "human": human[i], "reward": s.reward, "status": s.status, "detail": s.detail,
                "prompt": tasks[i].prompt if tasks else "", "gold": tasks[i].answer if tasks else "",
                "response": responses[i].text if responses else ""}

    return {"n": len(scores), "verified": len(verified), "threshold": threshold,
            "accuracy": result.accuracy, "kappa": result.kappa,
            "labels": [str(x).lower() for x in result.labels], "confusion": result.confusion,
            "disagreements": [example(verified[j]) for j in result.disagreements],
            "unverified": [example(i) for i, s in enumerate(scores) if s.status != "ok"]}


def check_gates(domain_configs: dict, domains: dict, base_dir: str = "") -> dict[str, float]:
    """Each gated domain's kappa ({domain: kappa}); UserError, one line, for the first below its
    `reward_check.min_kappa`."""
    kappas: dict[str, float] = {}
    for name, dcfg in domain_configs.items():
        gate = dcfg.reward_check
        if not gate.labels:
            continue
        path = Path(gate.labels).expanduser()
        path = path if path.is_absolute() or not base_dir else Path(base_dir) / path
        domain = domains[name]
        tasks, responses, human = read_labels(path, domain_task_maker(domain))
        scores = domain_reward(domain, dcfg.reward)(tasks, responses)
        report = agreement_report(scores, human, gate.threshold)
        kappas[name] = report["kappa"]
        if not report["kappa"] >= gate.min_kappa:  # NaN fails too
            raise UserError(f"domains.{name}.reward_check: the reward agrees with {path.name} at kappa "
                            f"{report['kappa']:.3f} (accuracy {report['accuracy']:.3f}, {report['verified']} "
                            f"labels), below min_kappa {gate.min_kappa}: fix the reward before training on it")
    return kappas
