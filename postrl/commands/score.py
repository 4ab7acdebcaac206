"""postrl score RECIPE --domain NAME RESPONSES.jsonl: grade responses as training would, without a model.

Each line of RESPONSES is one data set row (the columns the domain's recipe reads) plus
`response`, the reply to grade (and optionally `finish_reason`: stop or length, default stop).
For each line, one JSON object on stdout:

    {"line": 1, "reward": 1.1, "correct": true, "status": "ok", "extracted": "72",
     "components": {"correct": 1.0, "format": 1.0}, "detail": ""}

`reward` is what the trainer would use: the domain's verifier, then the recipe's `reward:` terms
for the domain. `correct` is true, false, or null when the verifier could not decide (status
timeout or error). A summary goes to stderr. A malformed line stops with `RESPONSES:LINE` and the
column, as a bad data set row does. Use it to test a verifier, an extractor or a user reward
before spending compute on training.
"""

from __future__ import annotations

import json
import sys

from postrl.abilities import ReadsRows


def add_parser(sub) -> None:
    p = sub.add_parser("score", help="grade responses with a recipe's domain (no model)", description=__doc__)
    p.add_argument("recipe", help="YAML recipe naming the domain")
    p.add_argument("responses", help="JSONL: a row's columns plus `response` per line")
    p.add_argument("--domain", required=True, help="the recipe's domain (a key of `domains`) to grade with")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module that registers verifiers, reward terms or domains (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.commands.reward_check import recipe_domain
    from postrl.errors import UserError
    from postrl.rewards.scoring import trained_reward

    built = recipe_domain(args)
    with built as (domain, weights):
        if not isinstance(domain, ReadsRows):
            raise UserError(f"--domain {args.domain}: a {built.type_name} domain makes its own problems; "
                            "score grades data set domains (type: dataset)")
        tasks, responses = read_responses(args.responses, domain)
        scores = trained_reward(domain, weights, tasks, responses)
    for i, s in enumerate(scores, 1):
        print(json.dumps({"line": i, "reward": s.reward, "correct": s.correct, "status": s.status,
                          "extracted": s.extracted, "components": s.components, "detail": s.detail}))
    right = sum(s.correct is True for s in scores)
    unverified = sum(s.status != "ok" for s in scores)
    print(f"{len(scores)} responses: {right} correct, {len(scores) - right - unverified} not, "
          f"{unverified} could not be verified", file=sys.stderr)
    return 0


def read_responses(path: str, domain):
    """(tasks, responses) of a RESPONSES file; a malformed line raises UserError('FILE:LINE: ...')."""
    from postrl.errors import UserError
    from postrl.records import Response
    from postrl.tasks.dataset import RowError
    from postrl.tasks.dataset_files import BadRow, read_rows

    if not path.endswith(".jsonl"):
        raise UserError(f"{path}: expected a .jsonl file of rows with a `response` each")
    tasks, responses = [], []
    for where, row in read_rows(path):
        if isinstance(row, BadRow):
            raise UserError(f"{where}: {row.problem}")
        reply, finish = row.pop("response", None), row.pop("finish_reason", "stop")
        if not isinstance(reply, str):
            raise UserError(f"{where}: column 'response': {'missing' if reply is None else 'expected text'}")
        if finish not in ("stop", "length"):
            raise UserError(f"{where}: column 'finish_reason': expected stop or length, got {finish!r}")
        try:
            tasks.append(domain.task_of_row(row, where))
        except RowError as e:
            raise UserError(e.at(where)) from None
        responses.append(Response(reply, finish))
    if not tasks:
        raise UserError(f"{path}: no rows")
    return tasks, responses
