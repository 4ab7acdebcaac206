"""The user's side of postrl: the Python API with callable rewards, extensions (`imports:` and
`--import`), per-domain generation limits, chat prompts, eval-only domains and `eval --recipe`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import postrl
from postrl.cli import main
from postrl.config.loading import load_config
from postrl.engines.orders import Order, generate
from postrl.errors import ConfigError, UserError
from postrl.extensions import load_recipe
from postrl.records import Response, Task
from postrl.rewards.callable_reward import CallableTerm
from postrl.sampling.policy import Policy
from postrl.store.rollouts import read_rows

RECIPE = "recipes/default.yaml"
FAST = ["train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4", "eval.num_problems=4",
        "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false", "monitor.spot_check_every_steps=0",
        "monitor.sinks=[]"]
QUIET = lambda *a: None  # noqa: E731


def fast(model_dir, run_dir, *extra) -> list[str]:
    return [f"model.name={model_dir}", f"run.dir={run_dir}", *FAST, *extra]


# ---- import postrl stays light ------------------------------------------------------------------


def test_import_postrl_and_help_do_not_load_torch():
    code = ("import sys, postrl, postrl.cli\n"
            "try:\n    postrl.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert callable(postrl.__getattr__) and 'postrl.api' not in sys.modules\n"
            "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert postrl.train.__module__ == "postrl.api" and postrl.evaluate.__module__ == "postrl.api"


# ---- the Python API with callable rewards --------------------------------------------------------


def test_python_api_with_a_callable_reward_trains_and_changes_the_weights(tiny_model_dir, tmp_path):
    seen = []

    def short(prompts, completions, answer=None, **columns):  # a closure: it would not pickle
        seen.append(len(completions))
        return [1.0 if len(c) <= 3 else 0.0 for c in completions]

    run_dir = postrl.train(RECIPE, overrides=fast(tiny_model_dir, tmp_path / "run"), reward_funcs=[short], log=QUIET)
    assert run_dir == tmp_path / "run" and seen and set(seen) == {4}  # one call per group of 4
    rows = read_rows(run_dir)
    assert len(rows) == 2 * 16 and all("short" in r.reward_components for r in rows)
    assert all(r.reward == r.reward_components["reward"] + r.reward_components["short"] for r in rows)
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert "short" not in __import__("postrl.rewards.terms", fromlist=["TERMS"]).TERMS  # registered for one run


def test_a_callable_reward_that_hangs_or_raises_is_a_recorded_status(tiny_model_dir, tmp_path):
    def hangs(prompts, completions, **columns):
        time.sleep(5)

    def raises(prompts, completions, **columns):
        raise ValueError("boom")

    for fn, status, detail in ((hangs, "timeout", "no answer within 0.2s"), (raises, "error", "ValueError: boom")):
        run_dir = postrl.train(RECIPE, overrides=fast(tiny_model_dir, tmp_path / fn.__name__), reward_funcs=[fn],
                               reward_timeout_s=0.2, log=QUIET)
        rows = read_rows(run_dir)
        assert [r.step for r in rows].count(1) == 16 and (run_dir / "final" / "config.json").is_file()
        assert {r.verifier_status for r in rows} == {status}
        assert all(f"{fn.__name__}: {status} {detail}" in r.detail for r in rows)


def test_callable_term_statuses_by_hand():
    tasks = [Task("d", "t1", "1+1=", "2", meta={"row": {"answer": "2", "x": 1}})] * 2
    responses = [Response("2", "stop"), Response("3", "stop")]
    got = CallableTerm(lambda p, c, answer, x: [float(a == b) for a, b in zip(c, answer)])(tasks, responses)
    assert [(s.reward, s.status) for s in got] == [(1.0, "ok"), (0.0, "ok")]
    bad = CallableTerm(lambda p, c, **k: [1.0])(tasks, responses)
    assert {s.status for s in bad} == {"error"} and "returned 1 values for 2" in bad[0].detail
    nan = CallableTerm(lambda p, c, **k: [None, "x"])(tasks, responses)  # None: TRL's "does not apply"
    assert [s.status for s in nan] == ["not_applicable", "error"] and "value 'x' is not a number" in nan[1].detail
    inf = CallableTerm(lambda p, c, **k: [float("nan"), float("inf")])(tasks, responses)
    assert [s.status for s in inf] == ["error", "error"]


# ---- TRL's reward-function semantics -------------------------------------------------------------


def accuracy_reward(completions, solution, log_extra=None, **kwargs):
    """TRL's `trl.rewards.accuracy_reward`, its shape and its rule: math_verify on the gold and the
    reply, None where the gold does not parse, `log_extra` of what it parsed (used where trl is not
    installed)."""
    from math_verify import parse, verify

    rewards, golds = [], []
    for completion, sol in zip(completions, solution, strict=True):
        gold = parse(sol, parsing_timeout=None)  # None: not in the main thread, as TRL's does
        golds.append(str(gold) if gold else "[unparseable]")
        answer = parse(completion[0]["content"], parsing_timeout=None)
        rewards.append(float(verify(gold, answer, timeout_seconds=None)) if gold else None)
    if log_extra is not None:
        log_extra("solution", list(solution))
        log_extra("gold_parsed", golds)
    return rewards


def trl_accuracy(source: str):
    if source == "same shape":
        return accuracy_reward
    rewards = pytest.importorskip("trl.rewards", reason="trl is not installed in this environment: TRL's own "
                                                        "accuracy_reward cannot run; its same-shape copy does")
    return rewards.accuracy_reward


def test_trl_calling_convention_by_keyword_with_log_extra_and_log_metric():
    from postrl.records import NOT_APPLICABLE

    tasks = [Task("d", "t1", "q", "2", meta={"row": {"answer": "2"}, "conversational": True},
                 messages=({"role": "user", "content": "q"},))] * 3
    responses = [Response("2", "stop"), Response("3", "stop"), Response("", "stop")]

    def graded(completions, answer, log_extra, log_metric, **kwargs):  # completions first, as TRL's own
        texts = [c[0]["content"] for c in completions]
        log_extra("seen", texts)
        log_metric("empty_share", sum(not t for t in texts) / len(texts))
        return [None if not t else float(t == a) for t, a in zip(texts, answer)]

    got = CallableTerm(graded)(tasks, responses)
    assert [(s.reward, s.status) for s in got] == [(1.0, "ok"), (0.0, "ok"), (0.0, NOT_APPLICABLE)]
    assert [s.logged for s in got] == [{"seen": "2"}, {"seen": "3"}, {"seen": ""}]
    assert got[0].metrics == {"reward_fn/graded": 1.0, "reward_fn/graded/empty_share": 1 / 3}
    assert got[2].metrics == {"reward_fn/graded/empty_share": 1 / 3}  # None: left out of the function's mean
    uneven = CallableTerm(lambda completions, log_extra, **k: log_extra("x", [1]) or [1.0] * 3)(tasks, responses)
    assert {s.status for s in uneven} == {"error"} and "log_extra('x') gave 1 values for 3" in uneven[0].detail


def test_none_is_left_out_of_the_sum_and_all_none_is_unverified():
    from postrl.records import NOT_APPLICABLE, Score
    from postrl.rewards.composite import apply_terms
    from postrl.rewards.terms import TERMS

    tasks = [Task("d", "t", "q", "1")] * 3  # one group: the functions are called once
    responses = [Response("1", "stop")] * 3
    TERMS.add("first", CallableTerm(lambda p, c, **k: [None, 0.5, None], name="first"))
    TERMS.add("second", CallableTerm(lambda p, c, **k: [2.0, 1.0, None], name="second"))
    try:
        own = [Score(1.0, True, components={"correct": 1.0})] * 3
        got = apply_terms({"first": 1.0, "second": 0.25}, tasks, responses, own)
        assert [s.reward for s in got] == [0.5, 0.75, 0.0]
        assert [s.status for s in got] == ["ok", "ok", NOT_APPLICABLE] and got[2].correct is None
        assert "first" not in got[0].components and got[1].components["first"] == 0.5
        kept = apply_terms({"reward": 1.0, "first": 1.0}, tasks, responses, own)  # the verdict always applies
        assert [(s.reward, s.status, s.correct) for s in kept] == [(1.0, "ok", True), (1.5, "ok", True),
                                                                   (1.0, "ok", True)]
    finally:
        TERMS.remove("first")
        TERMS.remove("second")


def test_reward_weights_one_per_function():
    from postrl.api import weigh_terms

    cfg = load_config(RECIPE)
    weigh_terms(cfg, ["a", "b"], [1.0, 0.25])
    assert cfg.domains["arith"].reward == {"reward": 1.0, "a": 1.0, "b": 0.25}
    with pytest.raises(UserError, match="reward_weights: 1 weights for 2 reward functions") as e:
        postrl.train(RECIPE, reward_funcs=[lambda p, c: [], lambda p, c: []], reward_weights=[1.0])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("source", ["trl", "same shape"])
def test_trl_accuracy_reward_where_the_gold_does_not_parse_is_unverified_not_zero(tiny_model_dir, tmp_path, source):
    accuracy = trl_accuracy(source)

    def brevity(completions, solution, log_metric=None, **kwargs):  # applies where the gold is a number
        short = [len(c[0]["content"]) < 4 for c in completions]
        log_metric("short_share", sum(short) / len(short))
        return [float(s) if sol.isdigit() else None for s, sol in zip(short, solution)]

    rows = [{"question": f"{a}+{a}=", "solution": str(2 * a) if a % 3 else "see the proof"} for a in range(10, 50)]
    recipe = {"domains": {"gsm": {"type": "dataset", "reward": {"accuracy_reward": 1.0},
                                  "params": {"prompt": "{question}", "system": "Add.", "answer": "solution",
                                             "verifier": "exact", "heldout_percent": 10}}}}
    run_dir = postrl.train(recipe, overrides=fast(tiny_model_dir, tmp_path / "run"), datasets={"gsm": rows},
                           reward_funcs=[accuracy, brevity], reward_weights=[1.0, 0.25], log=QUIET)
    rows_out = read_rows(run_dir)
    proof = [r for r in rows_out if json.loads(r.task_columns)["solution"] == "see the proof"]
    number = [r for r in rows_out if r not in proof]
    assert proof and number
    assert {(r.verifier_status, r.correct, r.advantage, r.reward) for r in proof} == {("not_applicable", None, 0.0, 0.0)}
    assert all("accuracy_reward" not in r.reward_components for r in proof)
    assert {json.loads(r.reward_logs)["gold_parsed"] for r in proof} == {"[unparseable]"}
    assert {r.verifier_status for r in number} == {"ok"}
    assert all(r.reward == r.reward_components["accuracy_reward"] + 0.25 * r.reward_components["brevity"]
               for r in number)
    assert all(json.loads(r.reward_logs)["solution"] == json.loads(r.task_columns)["solution"] for r in number)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for step, m in enumerate(metrics):
        applied = [r.reward_components["accuracy_reward"] for r in number if r.step == step]
        assert m["reward_fn/accuracy_reward"] == pytest.approx(sum(applied) / len(applied))  # None left out
        assert 0.0 <= m["reward_fn/brevity/short_share"] <= 1.0
        assert m["verifier/unverified"] == sum(r.step == step for r in proof) / 16


def test_a_callable_reward_under_ray_fails_at_once_with_one_line(tmp_path):
    with pytest.raises(UserError, match="engine: ray") as e:
        postrl.train(RECIPE, overrides=["engine=ray", f"run.dir={tmp_path / 'run'}"], reward_funcs=[lambda p, c: []])
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_datasets_in_memory_are_written_beside_the_run(tmp_path):
    from postrl.api import attach_datasets

    cfg = load_config(RECIPE, [f"run.dir={tmp_path / 'run'}"])
    attach_datasets(cfg, {"arith": [{"q": "1+1=", "a": 2}], "extra": str(tmp_path / "x.jsonl")})
    path = Path(cfg.domains["arith"].params["path"])
    assert path == (tmp_path / "run" / "data" / "arith.jsonl").resolve()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"q": "1+1=", "a": 2}]
    assert cfg.domains["extra"].type == "dataset" and cfg.domains["extra"].params["path"] == str(tmp_path / "x.jsonl")



def test_python_train_into_a_run_refuses_before_writing_and_overwrite_moves_it_with_its_rows(tmp_path):
    from postrl.api import attach_datasets

    run_dir = tmp_path / "run"
    (run_dir / "data").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")  # a run that was trained on these rows
    (run_dir / "data" / "arith.jsonl").write_text('{"q": "2+2=", "a": 4}\n')
    before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="already holds a run") as e:
        postrl.train(RECIPE, overrides=[f"run.dir={run_dir}"], datasets={"arith": [{"q": "1+1=", "a": 2}]}, log=QUIET)
    assert "\n" not in str(e.value) and "run.overwrite=true" in str(e.value)
    assert {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # its rows untouched

    moved = []
    cfg = load_config(RECIPE, [f"run.dir={run_dir}", "run.overwrite=true"])
    attach_datasets(cfg, {"arith": [{"q": "1+1=", "a": 2}]}, log=moved.append)
    assert moved == [f"run.overwrite: the run that was in {run_dir} is now in {tmp_path / 'run.old-1'}"]
    old = tmp_path / "run.old-1"
    assert {p.name: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before  # moved whole, rows and all
    assert [json.loads(x) for x in (run_dir / "data" / "arith.jsonl").read_text().splitlines()] == [{"q": "1+1=", "a": 2}]
    assert [p.name for p in run_dir.iterdir()] == ["data"]  # the new run's rows, no stray temporary file

# ---- extensions ----------------------------------------------------------------------------------

PLUGIN = '''
from dataclasses import dataclass
from postrl.monitor.monitors import register_monitor
from postrl.rewards.terms import register_term

@register_term("{term}")
def {term}(tasks, responses):
    return [0.5 for _ in responses]

@dataclass
class Settings:
    enabled: bool = True
    action: str = "warn"
    min_reward: float = 0.0

@register_monitor("{monitor}", settings=Settings)
class Watch:
    def __init__(self, cfg, ctx):
        self.cfg, self.values = cfg, {{}}
    def update(self, step, metrics, samples):
        self.values = {{"monitor/{monitor}": self.cfg.min_reward}}
        return []
    def state_dict(self):
        return {{}}
    def load_state_dict(self, state):
        pass
'''


def write_plugin(tmp_path: Path, term: str, monitor: str) -> Path:
    (tmp_path / "plugins").mkdir(exist_ok=True)
    path = tmp_path / "plugins" / f"{term}_plugin.py"
    path.write_text(PLUGIN.format(term=term, monitor=monitor))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"imports: [./plugins/{path.name}]\n"
                      f"domains: {{arith: {{params: {{levels: [2]}}, reward: {{reward: 1.0, {term}: 1.0}}}}}}\n"
                      f"monitor: {{{monitor}: {{min_reward: 0.25}}}}\n")
    return recipe


def test_imports_register_a_term_and_a_monitor_checked_like_built_ins(tiny_model_dir, tmp_path):
    recipe = write_plugin(tmp_path, "half", "watch_half")
    with pytest.raises(ConfigError, match="monitor.watch_half.min_reward"):
        load_recipe(recipe, ["monitor.watch_half.min_reward=high"])
    with pytest.raises(ConfigError, match="did you mean 'monitor.watch_half'"):
        load_recipe(recipe, ["monitor.watch_hal.enabled=false"])
    cfg = load_recipe(recipe, fast(tiny_model_dir, tmp_path / "run"))
    assert cfg.imports == [str(tmp_path / "plugins" / "half_plugin.py")] and cfg.monitor.watch_half.min_reward == 0.25
    assert main(["train", str(recipe), *fast(tiny_model_dir, tmp_path / "run")]) == 0
    rows = read_rows(tmp_path / "run")
    assert {r.reward_components["half"] for r in rows} == {0.5}
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["monitor/watch_half"] for m in metrics] == [0.25, 0.25]
    saved = load_recipe(tmp_path / "run" / "config.yaml")  # resumable: the saved config loads its imports
    assert saved.monitor.watch_half.min_reward == 0.25 and saved.imports == cfg.imports


def test_command_line_import_and_a_broken_module_exit_2_with_one_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("x = 1\nraise RuntimeError('not today')\n")
    assert main(["plan", RECIPE, "--import", str(tmp_path / "broken.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "RuntimeError: not today (broken.py:2)" in err
    assert main(["plan", RECIPE, "--import", "no_such_module_here"]) == 2
    assert "no module named 'no_such_module_here'" in capsys.readouterr().err


def test_pool_workers_inherit_the_extensions(tmp_path):
    from postrl.extensions import ENV, load
    from postrl.rewards.workers.pool import WorkerPool

    (tmp_path / "answers_ext.py").write_text("def job(x):\n    return x * 2\n")
    load([str(tmp_path / "answers_ext.py")])
    assert str(tmp_path / "answers_ext.py") in json.loads(__import__("os").environ[ENV])
    pool = WorkerPool("answers_ext:job", workers=1, timeout_s=10.0, confine=False)
    try:
        assert [o.value for o in pool.map([2, 5])] == [4, 10]  # the worker found the module by its file
    finally:
        pool.close()


# ---- generation limits per domain, chat prompts --------------------------------------------------


def test_per_domain_max_new_tokens_and_stop_split_the_order_only_when_set(tiny_model_dir):
    from postrl.builtin_models import load_model
    from postrl.seeding import step_generator

    model, tok = load_model(str(tiny_model_dir))
    policy = Policy(model, tok)
    base = ["train.samples_per_prompt=2", "train.max_new_tokens=6",
            "domains={arith: {params: {levels: [2]}}, long: {type: arith, params: {levels: [2]}}}"]
    tasks = [Task("arith", "a", "12+34=", "46"), Task("long", "b", "55+11=", "66"), Task("arith", "c", "1+2=", "3")]
    order = Order(0, tasks, [1.0] * 6, 0)
    plain = generate(policy, order, load_config(None, base))
    want = policy.sample(tasks, 2, __import__("postrl.sampling.generate", fromlist=["GenParams"]).GenParams(6),
                         step_generator(0, 0, 0), [1.0] * 6)
    assert [s.completion_ids for s in plain] == [s.completion_ids for s in want]  # no override: one call
    cfg = load_config(None, [*base, "domains.long.max_new_tokens=2", "domains.arith.stop=['=']"])
    split = generate(policy, order, cfg)
    assert [s.task.task_id for s in split] == ["a", "a", "c", "c", "b", "b"]  # part after part
    assert [s.group for s in split] == [0, 0, 1, 1, 2, 2]
    assert all(len(s.completion_ids) <= 2 for s in split if s.task.domain == "long")
    assert all("=" not in s.text for s in split if s.task.domain == "arith")


class ChatTok:
    """A tokenizer with a chat template: renders the messages it is given, one id per character."""

    chat_template = "yes"
    eos_token_id = pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [ord(ch) for ch in text]

    def __call__(self, text):
        return {"input_ids": [ord(ch) for ch in text]}


def test_chat_prompts_render_the_tasks_messages_with_the_system_turn():
    policy = Policy(None, ChatTok())
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"})
    as_text = lambda ids: "".join(map(chr, ids))  # noqa: E731
    assert as_text(policy.encode_task(Task("d", "t", "2+2?", "4", messages=messages))) == \
        "<system>Be brief.<user>2+2?<assistant>"
    assert as_text(policy.encode_task(Task("d", "t", "2+2?", "4"))) == "<user>2+2?<assistant>"
    ChatTok.chat_template = None
    try:
        assert as_text(policy.encode_task(Task("d", "t", "2+2?", "4", messages=messages))) == "2+2?"
    finally:
        ChatTok.chat_template = "yes"


# ---- eval: --recipe, eval-only domains, the base model at step 0 ----------------------------------


def test_eval_recipe_evaluates_its_domains_and_eval_only_domains(tiny_model_dir, tmp_path, capsys):
    recipe = tmp_path / "eval.yaml"
    recipe.write_text("domains: {arith: {params: {levels: [2]}, max_new_tokens: 4}}\n"
                      "eval: {num_problems: 3, samples_per_problem: 2, k: [1, 2],\n"
                      "       domains: {sort_only: {type: sort}}}\n")
    assert main(["eval", str(tiny_model_dir), "--recipe", str(recipe), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"arith", "sort_only"}
    assert all(r["n_problems"] == 3 and set(r) >= {"greedy", "pass@1", "pass@2"} for r in result.values())
    assert main(["eval", str(tiny_model_dir), "--recipe", str(recipe), "--domains", "sort_only", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"sort_only"}
    assert main(["eval", str(tiny_model_dir), "--recipe", str(recipe), "eval.domains.x.type=bogus"]) == 2
    assert "eval.domains.x.type" in capsys.readouterr().err


def test_eval_at_start_scores_the_base_model_and_leaves_the_rollouts_as_they_were(tiny_model_dir, tmp_path):
    runs = {}
    for at_start in (False, True):
        cfg = load_config(RECIPE, fast(tiny_model_dir, tmp_path / str(at_start), f"eval.at_start={at_start}",
                                       "eval.domains={sorting: {type: sort}}"))
        runs[at_start] = postrl.train(cfg, log=QUIET)
    assert sorted(p.name for p in (runs[True] / "eval").iterdir()) == ["step_0.json", "step_2.json"]
    assert set(json.loads((runs[True] / "eval" / "step_0.json").read_text())) == {"arith", "sorting"}
    got, want = read_rows(runs[True]), read_rows(runs[False])
    assert [(r.token_ids, r.reward) for r in got] == [(r.token_ids, r.reward) for r in want]
    a, b = (load_file(runs[x] / "final" / "model.safetensors") for x in (True, False))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the README's own-data section: its recipe and its Python example run ------------------------

REPO = Path(__file__).resolve().parents[1]


def test_the_docs_show_the_own_data_recipe_and_the_example_as_they_are():
    page = (REPO / "docs/own-data.md").read_text()
    assert (REPO / "recipes/own_data.yaml").read_text().rstrip() in page
    assert (REPO / "examples/train_with_python.py").read_text().rstrip() in page


def test_the_own_data_recipe_trains_two_steps(tiny_model_dir, tmp_path):
    cfg = load_recipe(REPO / "recipes/own_data.yaml", [*fast(tiny_model_dir, tmp_path / "run"), "model.lora.r=0",
                                                       "eval.at_start=false", "domains.gsm.max_new_tokens=8"])
    run_dir = postrl.train(cfg, log=QUIET)
    rows = read_rows(run_dir)
    assert len(rows) == 32 and {r.domain for r in rows} == {"gsm"} and all(len(r.token_ids) <= 8 for r in rows)
    assert {r.verifier_status for r in rows} <= {"ok", "timeout", "error"}


def test_the_python_example_trains_two_steps(tiny_model_dir, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "examples/train_with_python.py"), "--model", str(tiny_model_dir),
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'sums': {'greedy'" in done.stdout and (tmp_path / "run" / "final" / "config.json").is_file()
    assert (tmp_path / "run" / "data" / "sums.jsonl").is_file()
