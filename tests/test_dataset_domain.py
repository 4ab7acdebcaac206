"""The `dataset` domain: every file format, bad rows, the held-out split, epochs without
replacement, paths relative to the recipe, and a 2-step training run whose rollout store keeps
each row's columns and the extracted answer."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from postrl.checkpoint import CheckpointManager
from postrl.cli import main
from postrl.config.loading import load_config
from postrl.errors import ConfigError, UserError
from postrl.records import Response
from postrl.rewards.extract import extract
from postrl.store.query import query
from postrl.tasks.catalog import make_domain

ROWS = [{"question": f"{a}+{b}=", "answer": f"#### {a + b}", "level": f"Level {1 + a % 3}"}
        for a, b in [(12, 34), (5, 7), (40, 2), (19, 23), (8, 8), (31, 11), (66, 3), (27, 15)]]
DATA = Path(__file__).resolve().parents[1] / "postrl" / "data"


def write(path: Path, rows: list[dict], fmt: str) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows, indent=1))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def gsm(path, **params):
    return make_domain("dataset", {"path": str(path), "prompt": "{question}", "answer": "answer",
                                   "verifier": "numeric", "heldout_percent": 25, **params}, seed=0, name="gsm")


@pytest.mark.parametrize("fmt, suffix", [("jsonl", ".jsonl"), ("json", ".json"), ("parquet", ".parquet"),
                                         ("csv", ".csv"), ("disk", "")])
def test_every_format_loads_the_same_tasks(tmp_path, fmt, suffix):
    d = gsm(write(tmp_path / f"rows{suffix}", ROWS, fmt), level="level")
    tasks = d._train + d._heldout
    assert sorted(t.prompt for t in tasks) == sorted(r["question"] for r in ROWS)
    t = next(t for t in tasks if t.prompt == "12+34=")
    assert t.answer == "46" and t.level == 1 and t.meta["row"] == ROWS[0]
    assert t.messages == ({"role": "user", "content": "12+34="},)
    assert d.levels == sorted({t.level for t in d._train})


def test_json_lines_in_a_json_file_and_line_numbers_of_an_array(tmp_path):
    lines = tmp_path / "rows.json"
    write(lines, ROWS, "jsonl")
    assert len(gsm(lines)._train + gsm(lines)._heldout) == len(ROWS)
    array = tmp_path / "bad.json"
    array.write_text("[\n" + json.dumps(ROWS[0]) + ",\n\n" + json.dumps({"question": "1+1="}) + "\n]")
    with pytest.raises(UserError) as e:
        gsm(array)
    assert str(e.value).startswith(f"{array}:4: column 'answer': missing")  # the line the item starts on


def test_a_bad_row_stops_with_file_line_and_column_or_is_skipped(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(ROWS[0]), json.dumps({"question": "1+1=", "answer": ["2"]}), "not json",
             json.dumps({"answer": "2"}), json.dumps(ROWS[1])]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        gsm(path)
    assert str(e.value).splitlines() == [
        f"{path}:2: column 'answer': expected text or a number, got list (domain gsm; on_bad_row: skip leaves such rows out)"]
    d = gsm(path, on_bad_row="skip", heldout_percent=1)
    assert len(d._train + d._heldout) == 2 and len(d.skipped) == 3
    assert [s.split(": ", 1)[0] for s in d.skipped] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "column 'question': missing" in d.skipped[2]
    assert "skipped 3 bad rows" in capsys.readouterr().err


def test_params_are_checked(tmp_path):
    path = write(tmp_path / "rows.jsonl", ROWS, "jsonl")
    for params, key in [({"prompt": ""}, "prompt"), ({"messages": "m"}, "prompt"), ({"answer": ""}, "answer"),
                        ({"verifier": "code"}, "tests"), ({"on_bad_row": "ignore"}, "on_bad_row"),
                        ({"heldout_percent": 0}, "heldout_percent"), ({"colour": 1}, "colour")]:
        with pytest.raises(UserError, match=f"domains.gsm.params.{key}"):
            gsm(path, **params)


def test_heldout_is_a_fixed_hash_split_or_its_own_file(tmp_path):
    path = write(tmp_path / "rows.jsonl", ROWS * 1, "jsonl")
    a, b = gsm(path, heldout_percent=40), make_domain(
        "dataset", {"path": str(path), "prompt": "{question}", "answer": "answer", "verifier": "numeric",
                    "heldout_percent": 40}, seed=7, name="gsm")
    assert [t.task_id for t in a.heldout(10)] == [t.task_id for t in b.heldout(10)]
    assert not {t.task_id for t in a._train} & {t.task_id for t in a._heldout}
    rng = random.Random(0)
    assert {a.sample(rng).task_id for _ in range(50)} == {t.task_id for t in a._train}
    test = write(tmp_path / "test.jsonl", ROWS[:3], "jsonl")
    c = gsm(path, heldout_percent=None, heldout_path=str(test))
    assert len(c._train) == len(ROWS) and [t.prompt for t in c.heldout(5)] == [r["question"] for r in ROWS[:3]]
    with pytest.raises(UserError, match="no held-out rows"):
        gsm(write(tmp_path / "one.jsonl", ROWS[:1], "jsonl"), heldout_percent=1).heldout(5)


def test_epochs_draw_every_row_once_and_resume_exactly(tmp_path):
    d = gsm(write(tmp_path / "rows.jsonl", ROWS, "jsonl"), heldout_percent=1)
    n = len(d._train)
    rng = random.Random(3)
    first = [d.sample(rng).task_id for _ in range(n)]
    assert sorted(first) == sorted(t.task_id for t in d._train) and d.epoch == 1
    d.sample(rng)
    state, rng_state = json.loads(json.dumps(d.state_dict())), rng.getstate()
    rest = [d.sample(rng).task_id for _ in range(2 * n)]
    assert d.epoch == 4  # 3n + 1 draws: the fourth epoch has begun
    again = gsm(tmp_path / "rows.jsonl", heldout_percent=1)
    again.load_state_dict(state)
    rng.setstate(rng_state)
    assert [again.sample(rng).task_id for _ in range(2 * n)] == rest
    lv = gsm(tmp_path / "rows.jsonl", heldout_percent=1, level="level")
    assert {lv.sample(rng, level=2).level for _ in range(5)} == {2}


def test_messages_column_and_system_prompt(tmp_path):
    rows = [{"chat": [{"role": "user", "content": "Capital of France?"}], "answer": "Paris"},
            {"chat": [{"role": "system", "content": "Own."}, {"role": "user", "content": "Capital of Italy?"}],
             "answer": "Rome"}]
    d = make_domain("dataset", {"path": str(write(tmp_path / "c.jsonl", rows, "jsonl")), "messages": "chat",
                                "system": "Answer in one word.", "answer": "answer", "verifier": "exact",
                                "heldout_percent": 1}, seed=0, name="qa")
    tasks = sorted(d._train + d._heldout, key=lambda t: t.answer)
    assert tasks[0].messages == ({"role": "system", "content": "Answer in one word."},
                                 {"role": "user", "content": "Capital of France?"})
    assert tasks[1].messages[0]["content"] == "Own." and tasks[1].prompt == "Capital of Italy?"
    assert [s.correct for s in d.score(tasks, [Response("Paris", "stop"), Response("Milan", "stop")])] == [True, False]


def test_the_shipped_fixtures_load_and_grade(tmp_path):
    g = make_domain("dataset", {"path": str(DATA / "gsm_symbolic_train.jsonl"),
                                "heldout_path": str(DATA / "gsm_symbolic_test.jsonl"), "prompt": "{question}",
                                "answer": "answer", "verifier": "numeric", "extract": "hash"}, seed=0, name="gsm")
    t = g.heldout(1)[0]
    assert t.answer.isdigit() and g.score([t], [Response(f"...\n#### {t.answer}", "stop")])[0].correct
    c = make_domain("dataset", {"path": str(DATA / "choice.jsonl"), "prompt": "{question}\n{options}",
                                "answer": "answer", "verifier": "choice", "heldout_percent": 20}, seed=0, name="mc")
    t = c._train[0]
    assert c.score([t], [Response(f"The answer is ({t.answer}).", "stop")])[0].correct
    rows = [json.loads(x) for x in (DATA / "mbpp_style.jsonl").read_text().splitlines()]
    assert len(rows) >= 10 and all(r["test_list"] and r["code"] for r in rows)


def test_the_gsm_fixtures_are_what_the_exporter_makes(monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(DATA.parents[1] / "scripts"))  # its shared tail, as when the script runs
    spec = importlib.util.spec_from_file_location("fixtures", DATA.parents[1] / "scripts" / "make_data_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for split, rows in module.gsm_rows().items():
        shipped = [json.loads(x) for x in (DATA / f"gsm_symbolic_{split}.jsonl").read_text().splitlines()]
        assert shipped == rows and all("\n#### " in r["answer"] or r["answer"].startswith("#### ") for r in rows)


def test_two_step_training_on_a_jsonl_dataset_stores_the_rows(tiny_model_dir, tmp_path, capsys):
    """A recipe next to its data (relative path), the tiny character-level model, 2 steps."""
    rows = [{"question": f"{a}+{b}=", "answer": f"#### {a + b}", "source": f"row{i}"}
            for i, (a, b) in enumerate((random.Random(0).randint(10, 60), random.Random(i).randint(10, 39))
                                       for i in range(40))]
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "sums.jsonl", rows, "jsonl")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "domains:\n  sums:\n    type: dataset\n    params: {path: data/sums.jsonl, prompt: '{question}', answer: answer,\n"
        "             verifier: numeric, extract: last_number, heldout_percent: 20}\n")
    run_dir = tmp_path / "run"
    code = main(["train", str(recipe), f"model.name={tiny_model_dir}", f"run.dir={run_dir}", "train.total_steps=2",
                 "train.prompts_per_step=4", "train.samples_per_prompt=4", "eval.num_problems=4",
                 "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false", "rl.entropy_coef=0.01",
                 "checkpoint.every_steps=1"])
    assert code == 0
    sql = ("SELECT json_extract_string(task_columns, '$.source') AS source, answer, "
           "json_extract_string(task_columns, '$.answer') AS raw, extracted, completion FROM rollouts")
    assert main(["rollouts", str(run_dir), "--sql", sql]) == 0  # queryable from the command line
    assert "row" in capsys.readouterr().out
    result = query(run_dir, sql)
    out = [dict(zip(result.columns, row)) for row in result.rows]
    by_source = {r["source"]: r for r in rows}
    assert len(out) == 2 * 4 * 4
    for r in out:
        assert by_source[r["source"]]["answer"] == r["raw"] == f"#### {r['answer']}"
        assert r["extracted"] == extract("last_number", r["completion"])
    assert (run_dir / "eval" / "step_2.json").is_file()
    state = CheckpointManager(run_dir).latest_valid().load_state()  # the epoch cursor is checkpointed
    assert state["domains"]["sums"]["epoch"] == 1 and state["domains"]["sums"]["cursor"] == 8


def test_train_epochs_sets_the_steps_and_draws_every_training_row_once(tiny_model_dir, tmp_path):
    """train.epochs=1 over 12 training rows at 4 prompts a step: 3 steps, each row drawn once."""
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 25)]
    write(tmp_path / "train.jsonl", rows[:12], "jsonl")
    write(tmp_path / "test.jsonl", rows[12:], "jsonl")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "domains:\n  sums:\n    type: dataset\n    params: {path: train.jsonl, heldout_path: test.jsonl,\n"
        "             prompt: '{question}', answer: answer, verifier: numeric, extract: last_number}\n")
    run_dir = tmp_path / "run"
    code = main(["train", str(recipe), f"model.name={tiny_model_dir}", f"run.dir={run_dir}", "train.epochs=1",
                 "train.prompts_per_step=4", "train.samples_per_prompt=2", "eval.num_problems=3",
                 "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false"])
    assert code == 0
    assert load_config(run_dir / "config.yaml").train.total_steps == 3  # the resolved steps are saved
    result = query(run_dir, "SELECT step, prompt FROM rollouts WHERE sample % 2 = 0 ORDER BY step, sample")
    prompts = [p for _, p in result.rows]
    assert sorted(prompts) == sorted(r["question"] for r in rows[:12])  # every row once, no held-out row
    assert {s for s, _ in result.rows} == {0, 1, 2}


# ---- verl's layout: dotted column paths, one file split into several domains ---------------------


def verl_row(i: int, a: int, b: int, source: str = "openai/gsm8k") -> dict:
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    question = f"{a}+{b}="
    return {"data_source": source, "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": i, "answer": f"{a} plus {b} #### {a + b}", "question": question}}


VERL = [verl_row(i, a, b) for i, (a, b) in enumerate([(12, 34), (5, 7), (40, 2), (19, 23), (8, 8), (31, 11)])]


@pytest.mark.parametrize("fmt, suffix", [("jsonl", ".jsonl"), ("parquet", ".parquet"), ("disk", "")])
def test_dotted_paths_read_nested_columns_in_every_format(tmp_path, fmt, suffix):
    path = write(tmp_path / f"verl{suffix}", VERL, fmt)
    d = make_domain("dataset", {"path": str(path), "messages": "prompt", "answer": "reward_model.ground_truth",
                                "level": "extra_info.index", "verifier": "numeric", "heldout_percent": 1},
                    seed=0, name="gsm")
    t = next(t for t in d._train + d._heldout if t.prompt == "12+34=")
    assert (t.answer, t.level, t.messages) == ("46", 0, ({"role": "user", "content": "12+34="},))
    f = make_domain("dataset", {"path": str(path), "prompt": "Q: {extra_info.question} ({prompt[0].role})",
                                "answer": "extra_info.answer", "verifier": "numeric", "heldout_percent": 1},
                    seed=0, name="gsm")
    t = next(t for t in f._train + f._heldout if t.meta["row"]["extra_info"]["index"] == 1)
    assert (t.prompt, t.answer) == ("Q: 5+7= (user)", "12")  # the GSM8K reference reduced to its #### part
    flat = write(tmp_path / "flat.jsonl", [{"reward_model.ground_truth": str(3 + i), "q": f"1+{2 + i}="}
                                           for i in range(4)], "jsonl")
    g = make_domain("dataset", {"path": str(flat), "prompt": "{q}", "answer": "reward_model.ground_truth",
                                "verifier": "numeric", "heldout_percent": 1}, seed=0, name="flat")
    assert sorted(t.answer for t in g._train + g._heldout) == ["3", "4", "5", "6"]  # a column named with a dot


def test_a_missing_dotted_path_names_the_part_that_is_missing(tmp_path, capsys):
    rows = [VERL[0], {**VERL[1], "reward_model": {"style": "rule"}}, {**VERL[2], "reward_model": "46"},
            {**VERL[3], "prompt": []}]
    path = write(tmp_path / "verl.jsonl", rows, "jsonl")  # JSON: a row may differ in shape
    params = {"path": str(path), "prompt": "{extra_info.question}", "answer": "reward_model.ground_truth",
              "verifier": "numeric", "heldout_percent": 1}
    with pytest.raises(UserError) as e:
        make_domain("dataset", params, seed=0, name="gsm")
    assert str(e.value).splitlines() == [
        f"{path}:2: column 'reward_model.ground_truth': reward_model has no 'ground_truth' (it has: style) "
        "(domain gsm; on_bad_row: skip leaves such rows out)"]
    d = make_domain("dataset", {**params, "on_bad_row": "skip", "prompt": "{prompt.0.content}"}, seed=0, name="gsm")
    assert len(d._train + d._heldout) == 1
    assert [s.split(": ", 1)[1] for s in d.skipped] == [
        "column 'reward_model.ground_truth': reward_model has no 'ground_truth' (it has: style)",
        "column 'reward_model.ground_truth': reward_model is str, not an object with 'ground_truth'",
        "column 'prompt.0.content': prompt is a list of 0; '0' is not an index in it"]
    assert "skipped 3 bad rows" in capsys.readouterr().err


MIXED = [*VERL, *(verl_row(10 + i, a, a, "copy") for i, a in enumerate((3, 14, 25, 36, 47, 58)))]
SPLIT = {"path": "mixed.parquet", "messages": "prompt", "answer": "reward_model.ground_truth", "heldout_percent": 30,
         "split_by": "data_source", "verifiers": {"openai/gsm8k": {"verifier": "numeric", "extract": "last_number"},
                                                  "copy": "exact"}}


def split_config(tmp_path, rows, **params):
    write(tmp_path / "mixed.parquet", rows, "parquet")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"domains": {"mix": {"type": "dataset", "weight": 2.0, "reward": {"reward": 1.0},
                                                      "params": {**SPLIT, **params}}}}))
    return load_config(recipe)


def test_split_by_makes_one_domain_per_value_with_its_own_verifier(tmp_path):
    from postrl.tasks.catalog import build_domains

    cfg = split_config(tmp_path, MIXED)
    assert list(cfg.domains) == ["mix/openai/gsm8k", "mix/copy"]
    assert [(d.type, d.weight, d.reward) for d in cfg.domains.values()] == [("dataset", 1.0, {"reward": 1.0})] * 2
    assert load_config(None, [f"domains={json.dumps(to_plain(cfg.domains))}"]).domains.keys() == cfg.domains.keys()
    domains = build_domains(cfg)
    gsm, copy = domains["mix/openai/gsm8k"], domains["mix/copy"]
    assert {t.meta["row"]["data_source"] for t in gsm._train + gsm._heldout} == {"openai/gsm8k"}
    assert len(gsm._train + gsm._heldout) == 6 and len(copy._train + copy._heldout) == 6
    assert {t.domain for t in copy._train} == {"mix/copy"} and copy.verifier.extract_spec != gsm.verifier.extract_spec
    t = gsm._train[0]
    assert gsm.score([t], [Response(f"so {t.answer}", "stop")])[0].correct  # numeric on the last number
    assert not copy.score([copy._train[0]], [Response(f"so {copy._train[0].answer}", "stop")])[0].correct  # exact


def to_plain(domains):
    from postrl.config.loading import to_dict

    return {name: to_dict(d) for name, d in domains.items()}


def test_an_unknown_split_value_is_a_bad_row_reported_once(tmp_path, capsys):
    from postrl.tasks.catalog import build_domains

    rows = [*MIXED, verl_row(99, 1, 1, "lighteval/MATH"), {**VERL[0], "data_source": None}]
    with pytest.raises(UserError) as e:
        build_domains(split_config(tmp_path, rows))
    assert str(e.value).splitlines() == [
        f"{tmp_path / 'mixed.parquet'}:13: column 'data_source': value 'lighteval/MATH' has no verifier (verifiers "
        "are given for: openai/gsm8k, copy) (domain mix/openai/gsm8k; on_bad_row: skip leaves such rows out)"]
    domains = build_domains(split_config(tmp_path, rows, on_bad_row="skip"))
    assert [len(d.skipped) for d in domains.values()] == [2, 0]  # reported by the first domain of the file
    assert capsys.readouterr().err.count("skipped") == 1
    with pytest.raises(ConfigError, match="domains.mix.params.verifiers"):
        load_config(None, ["domains={mix: {type: dataset, params: {path: x.parquet, split_by: data_source}}}"])


def test_a_verl_file_of_two_sources_trains_as_two_domains(tiny_model_dir, tmp_path):
    """verl's GSM8K layout, `answer: reward_model.ground_truth`, split by data_source: 2 steps."""
    rows = [verl_row(i, a, b) for i, (a, b) in enumerate((random.Random(i).randint(10, 60),
                                                          random.Random(-i).randint(10, 39)) for i in range(24))]
    rows += [verl_row(100 + i, a, 0, "copy") for i, a in enumerate(range(10, 34))]
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    split_config(cfg_dir, rows)
    run_dir = tmp_path / "run"
    code = main(["train", str(cfg_dir / "recipe.yaml"), f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
                 "train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
                 "eval.num_problems=3", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false",
                 "eval.every_steps=1"])
    assert code == 0
    result = query(run_dir, "SELECT domain, json_extract_string(task_columns, '$.data_source'), answer, "
                            "json_extract_string(task_columns, '$.reward_model.ground_truth') FROM rollouts")
    assert {d for d, *_ in result.rows} == {"mix/openai/gsm8k", "mix/copy"}
    assert all(d == f"mix/{source}" and answer == truth for d, source, answer, truth in result.rows)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all({"pass_rate/mix/openai/gsm8k", "pass_rate/mix/copy", "curriculum/weight/mix/copy"} <= set(m)
               for m in metrics)
    for step in (1, 2):
        assert set(json.loads((run_dir / "eval" / f"step_{step}.json").read_text())) >= {"mix/openai/gsm8k",
                                                                                          "mix/copy"}
