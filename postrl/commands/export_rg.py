"""postrl export-rg DATASET --n N --out FILE.jsonl [--seed S]: a reasoning-gym dataset as JSONL.

One line per problem: {"question": ..., "answer": ..., "dataset": ..., "index": i, "metadata": {...}},
where `answer` is reasoning-gym's reference answer. With `--gsm8k`, `answer` is written in
GSM8K's format instead: the worked solution when the dataset has one (`metadata.answer_cot`),
then a final `#### ANSWER` line, so the file trains a `type: dataset` domain with `answer: answer`
(the reference is what follows `####`). `--config '{"min_terms": 2}'` sets the dataset's config
fields. The same (dataset, seed, config) always gives the same file; nothing is downloaded.

    postrl export-rg gsm_symbolic --n 500 --out data/gsm_train.jsonl --seed 1 --gsm8k
"""

from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("export-rg", help="export a reasoning-gym dataset to JSONL", description=__doc__)
    p.add_argument("dataset", help="reasoning-gym dataset name, e.g. gsm_symbolic, basic_arithmetic")
    p.add_argument("--n", type=int, required=True, help="problems to write")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--seed", type=int, default=0, help="the dataset's seed (default 0)")
    p.add_argument("--config", default="{}", help="JSON object of dataset config fields")
    p.add_argument("--gsm8k", action="store_true", help="answers as GSM8K solutions ending in '#### ANSWER'")
    p.add_argument("--no-metadata", dest="metadata", action="store_false", help="leave out reasoning-gym's metadata")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.errors import UserError

    if args.n < 1:
        raise UserError("--n must be at least 1")
    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as e:
        raise UserError(f"--config: not JSON ({e.msg})") from None
    if not isinstance(config, dict):
        raise UserError("--config: expected a JSON object")
    rows = export_rows(args.dataset, args.n, args.seed, config, gsm8k=args.gsm8k, metadata=args.metadata)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} {args.dataset} problems to {out}")
    return 0


def export_rows(dataset: str, n: int, seed: int = 0, config: dict | None = None, *, gsm8k: bool = False,
                metadata: bool = True) -> list[dict]:
    """The first `n` problems of reasoning-gym's `dataset` at `seed`, as JSON-safe rows."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    from postrl.errors import UserError
    from postrl.tasks.dataset_files import json_safe

    if dataset not in DATASETS:
        raise UserError(f"unknown reasoning-gym dataset {dataset!r}; see `postrl eval --help` or rg:<name> domains")
    try:
        ds = reasoning_gym.create_dataset(dataset, size=n, seed=seed, **(config or {}))
    except (TypeError, ValueError, AssertionError) as e:
        raise UserError(f"{dataset}: bad config {config}: {e}") from None
    rows = []
    for i in range(n):
        item = ds[i]
        answer = "" if item.get("answer") is None else str(item["answer"])
        row = {"question": item["question"], "answer": gsm8k_answer(item, answer) if gsm8k else answer,
               "dataset": dataset, "index": i}
        if metadata:
            row["metadata"] = item.get("metadata", {})
        rows.append(json_safe(row))
    return rows


def gsm8k_answer(item: dict, answer: str) -> str:
    """GSM8K's answer format: the worked solution (when the item has one), then `#### ANSWER`."""
    cot = str((item.get("metadata") or {}).get("answer_cot") or "").strip()
    if "####" in cot:
        cot = cot.rsplit("####", 1)[0].rstrip()
    return f"{cot}\n#### {answer}" if cot else f"#### {answer}"
