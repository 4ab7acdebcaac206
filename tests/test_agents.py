"""Agents: tools (calculator, python in the sandbox, user functions), the call format and every
failure's recorded status, multi-turn episodes token in / token out (learner log-probs equal the
sampler's, observation tokens masked out of the loss and the KL), and the code-retry environment."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from postrl.builtin_models import load_model
from postrl.config.schema import DomainConfig, RLConfig, TrainConfig
from postrl.errors import ConfigError
from postrl.learner.learner import Learner
from postrl.model.logprobs import token_logprobs
from postrl.records import Response, Task
from postrl.sampling.episodes import EpisodeLimits, observation_ids, sample_episodes
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable
from postrl.tasks.catalog import make_domain
from postrl.tasks.env import ToolEnv
from postrl.tools.base import TOOLS, ToolCall, ToolContext, describe, parse_call, register_tool, run_call
from postrl.tools.builtin import calculate

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ tools and the call format


def test_calculator_does_arithmetic_and_nothing_else():
    assert calculate("123*45") == 5535
    assert calculate("-(2+3)**2 // 4") == -7
    for hostile in ["__import__('os').system('true')", "x+1", "[1]*10", "9**9**9", "open('f')", "(1).real"]:
        with pytest.raises(ValueError):
            calculate(hostile)
    calc = TOOLS.get("calculator")
    assert run_call(ToolCall("calculator", {"expression": "6/3"}), {"calculator": calc}, ToolContext()).text == "2"
    assert run_call(ToolCall("calculator", {"expression": "1/0"}), {"calculator": calc}, ToolContext()).status == "error"


@pytest.mark.parametrize("text, status", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>', "ok"),
    ("<tool_call>{name: calculator}</tool_call>", "malformed"),  # not JSON
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}', "malformed"),  # never closed
    ('<tool_call>["calculator"]</tool_call>', "malformed"),
    ('<tool_call>{"name": "calculator", "arguments": "2+2"}</tool_call>', "malformed"),
    ('<tool_call>{"name": "calculator", "arguments": {"expr": "2+2"}}</tool_call>', "malformed"),  # wrong argument
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown_tool"),
])
def test_every_call_gets_an_observation_and_a_status(text, status):
    tools = {"calculator": TOOLS.get("calculator")}
    result = run_call(parse_call(text), tools, ToolContext())
    assert result.status == status
    assert result.text == "4" if status == "ok" else result.text


def test_a_turn_without_a_call_is_an_answer():
    assert parse_call("the answer is 4") is None


def test_user_tool_signature_and_docstring_are_its_description_and_its_timeout_holds():
    def slow_add(a: int, b: int) -> int:
        """Add two integers, slowly."""
        if a < 0:
            time.sleep(5)
        if a == 13:
            raise RuntimeError("unlucky")
        return a + b

    register_tool(slow_add, name="test_slow_add")
    try:
        tool = TOOLS.get("test_slow_add")
        assert tool.description == "test_slow_add(a: int, b: int) -> int: Add two integers, slowly."
        assert "test_slow_add(a: int, b: int)" in describe({"test_slow_add": tool})
        tools, ctx = {"test_slow_add": tool}, ToolContext(timeout_s=0.3, output_chars=50)
        assert run_call(ToolCall("test_slow_add", {"a": 2, "b": 3}), tools, ctx).text == "5"
        t0 = time.perf_counter()
        late = run_call(ToolCall("test_slow_add", {"a": -1, "b": 3}), tools, ctx)
        assert late.status == "timeout" and time.perf_counter() - t0 < 2
        assert run_call(ToolCall("test_slow_add", {"a": 13, "b": 3}), tools, ctx).status == "error"
        assert run_call(ToolCall("test_slow_add", {"a": 1}), tools, ctx).status == "malformed"
    finally:
        TOOLS.remove("test_slow_add")


def test_unknown_tool_in_a_recipe_is_a_config_error():
    with pytest.raises(ConfigError, match="domains.arith.tools.*unknown tool.*calculator"):
        ToolEnv(make_domain("arith"), DomainConfig(tools=["calculater"]), "arith")


@pytest.fixture(scope="module")
def sandbox_env():
    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    env = ToolEnv(make_domain("arith"), DomainConfig(tools=["python"], tool_timeout_s=2.0, tool_output_chars=200), "arith")
    yield env
    env.close()


def python_call(code: str) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


@pytest.mark.parametrize("code, status, shows", [
    ("print(sum(range(10)))", "ok", "45"),
    ("raise ValueError('bad input')", "error", "ValueError: bad input"),
    ("while True:\n    pass", "timeout", "timed out"),
    ("import os\nwhile True:\n    os.fork()", None, ""),  # fork bomb: contained, whatever the status
    ("while True:\n    print('x' * 10000)", "output_limit", "output limit"),
])
def test_python_tool_runs_in_the_sandbox_and_hostile_code_is_a_status(sandbox_env, code, status, shows):
    episode = sandbox_env.reset(make_domain("arith").heldout(1)[0])
    t0 = time.perf_counter()
    observation, reward, done = episode.step(python_call(code))
    assert time.perf_counter() - t0 < 30 and reward is None and not done
    [turn] = observation
    assert turn["role"] == "tool" and turn["tool"] == "python"
    assert turn["status"] == status if status else turn["status"] in ("error", "timeout", "output_limit", "ok")
    assert shows in turn["content"]
    assert len(turn["content"]) <= len("<tool_result></tool_result>") + 200  # truncated to tool_output_chars


# ------------------------------------------------------------------ episodes, token in / token out

FEEDBACK = "12+3="


class Scripted:
    """An environment that answers every turn with the same user turn and ends on the third."""

    name, max_turns = "arith", 5
    stop = tuple("0123456789=")  # a turn ends at its first digit or "=" (as a tool call's closing tag would)

    def __init__(self, ends_at: int = 3):
        self.ends_at = ends_at

    def reset(self, task):
        return ScriptedEpisode(task, self.ends_at)


class ScriptedEpisode:
    def __init__(self, task, ends_at):
        self.messages, self.turns, self.ends_at = [{"role": "user", "content": task.prompt}], 0, ends_at
        self.correct, self.components = True, {"scripted": 1.0}

    def step(self, text):
        self.turns += 1
        if self.turns >= self.ends_at:
            return None, 1.0, True
        return [{"role": "user", "content": FEEDBACK}], None, False


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    return Policy(model, tok)


SIX = EpisodeLimits(6)


def episodes(policy, env, n=3, limits=SIX, seed=0, **kw):
    tasks = [Task("arith", f"t{i}", p, "") for i, p in enumerate(["1+2=", "47+38=", "9*9="])]
    return sample_episodes(policy, tasks, n, {"arith": env}, lambda t: limits, GenParams(limits.max_new_tokens),
                           torch.Generator().manual_seed(seed), **kw)


def test_learner_logprobs_of_a_multi_turn_episode_equal_the_samplers(policy):
    samples = episodes(policy, Scripted())
    obs = policy.tok(FEEDBACK, add_special_tokens=False)["input_ids"]
    for s in samples:
        assert s.episode.end_reason == "done" and s.episode.reward == 1.0
        assert [t.role for t in s.episode.turns] == ["assistant", "user", "assistant", "user", "assistant"]
        assert len(s.loss_mask) == len(s.completion_ids) == len(s.logprobs)
        assert sum(1 - m for m in s.loss_mask) == 2 * len(obs)
        # the observations sit verbatim between the sampled turns; nothing was re-tokenised
        turns = [t.tokens for t in s.episode.turns]
        a, b = turns[0], turns[0] + turns[1]
        assert s.completion_ids[a:b] == obs and s.loss_mask[a:b] == [0] * len(obs)
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp, _ = token_logprobs(policy.model, ids, torch.ones_like(ids), torch.ones(1))
        mine = logp[0, len(s.prompt_ids) - 1 :]
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        assert torch.allclose(mine[mask], torch.tensor(s.logprobs)[mask], atol=1e-5)


def test_episodes_are_deterministic_and_reported_by_whole_groups(policy):
    seen = []
    first = episodes(policy, Scripted(), on_ready=lambda ready: seen.append([s.group for s in ready]))
    again = episodes(policy, Scripted())
    assert [s.completion_ids for s in first] == [s.completion_ids for s in again]
    assert sorted(g for chunk in seen for g in chunk) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(len(chunk) % 3 == 0 for chunk in seen)


def test_turn_limit_token_budget_and_length_end_an_episode_with_a_reason(policy):
    never = Scripted(ends_at=99)
    assert {s.episode.end_reason for s in episodes(policy, never, limits=EpisodeLimits(3, stop=("=",)))} <= {"max_turns", "length"}
    short = episodes(policy, never, limits=EpisodeLimits(3, max_tokens=14))
    for s in short:
        assert s.episode.end_reason in ("context", "length")
        assert len(s.prompt_ids) + len(s.completion_ids) <= 14
        assert s.episode.reward is None


def test_observation_and_prompt_tokens_are_out_of_the_loss_and_the_kl(policy):
    import copy

    samples = episodes(policy, Scripted())
    for s in samples:
        s.score = None
    train = TrainConfig(samples_per_prompt=3, minibatches=1)
    learner = Learner(policy, copy.deepcopy(policy.model), train, RLConfig(kl_coef=0.1))
    batch = learner.build_batch(samples, kl_coef=0.1)
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        want = torch.zeros(batch.loss_mask.shape[1])
        want[start : start + len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float)
        assert torch.equal(batch.loss_mask[i], want)
        assert torch.all(batch.ref_logprobs[i][want == 0] == 0)
    # the loss does not see what sits at masked positions
    rows = torch.arange(len(samples))
    loss, _ = learner._micro_loss(batch, rows, 0.1, None)
    poked = copy.copy(batch)
    poked.old_logprobs = torch.where(batch.loss_mask == 0, 3.0, batch.old_logprobs)
    poked.ref_logprobs = torch.where(batch.loss_mask == 0, -7.0, batch.ref_logprobs)
    again, _ = learner._micro_loss(poked, rows, 0.1, None)
    assert torch.equal(loss, again)


def test_observation_tokens_are_the_chat_templates_delta_for_the_new_turn(tiny_model_dir):
    _, tok = load_model(str(tiny_model_dir))
    # a template in the char tokenizer's alphabet: each message is "<content>=" and the
    # assistant header "+"; the delta after an assistant turn is "=" + "12+3=" + "=" + "+"
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}+{% endif %}{{ m['content'] }}="
                         "{% endfor %}{% if add_generation_prompt %}+{% endif %}")
    pol = Policy(None, tok)
    history = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
    got = observation_ids(pol, history, [{"role": "user", "content": "12+3"}], ended_with_eos=False)
    assert tok.decode(got) == "=12+3=+"


@pytest.mark.parametrize("renders_tools", [True, False])
def test_a_template_that_renders_tools_gets_their_schemas_and_others_a_system_message(tiny_model_dir, renders_tools):
    """Qwen2.5- or Hermes-style templates describe tools themselves from `tools=`: they get the JSON
    schemas and the bare opening messages; a template without (SmolLM2's) gets `describe`'s
    system message. Either way the model's calls are parsed in the same tag format."""
    model, tok = load_model(str(tiny_model_dir))
    tok.chat_template = ("{% if tools %}{% for t in tools %}{{ t['function']['name'] }}{% endfor %}{% endif %}"
                         if renders_tools else "") + \
        "{% for m in messages %}{{ m['content'] }}={% endfor %}{% if add_generation_prompt %}+{% endif %}"
    seen = []
    render = tok.apply_chat_template

    def spy(messages, **kw):
        seen.append((messages, kw.get("tools")))
        return render(messages, **kw)

    tok.apply_chat_template = spy
    env = ToolEnv(make_domain("mul", {}, seed=0, name="mul"), DomainConfig(tools=["calculator"], max_turns=2), "mul")
    task = env.heldout(1)[0]
    sample_episodes(Policy(model, tok), [task], 1, {"mul": env}, lambda t: SIX, GenParams(6), torch.Generator())
    messages, tools = seen[0]
    described = any("calculator(expression: str)" in m["content"] for m in messages)
    if renders_tools:
        assert tools == [TOOLS.get("calculator").schema] and not described
        assert tools[0]["function"]["parameters"]["required"] == ["expression"]
    else:
        assert tools is None and described and messages[0]["role"] == "system"
    assert messages[-1]["content"] == task.prompt


def test_a_user_tools_schema_comes_from_its_signature():
    def area(width: float, height: float, unit: str = "m") -> str:
        """The area of a rectangle.

        More words that stay out of the schema."""
        return f"{width * height} {unit}2"

    from postrl.tools.base import FunctionTool

    fn = FunctionTool(area).schema["function"]
    assert fn["name"] == "area" and fn["description"] == "The area of a rectangle."
    assert fn["parameters"]["properties"] == {"width": {"type": "number"}, "height": {"type": "number"},
                                              "unit": {"type": "string"}}
    assert fn["parameters"]["required"] == ["width", "height"]


# ------------------------------------------------------------------ failure fed back: code_retry


@pytest.fixture(scope="module")
def code_retry():
    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    env = make_domain("code_retry", {"domain": {"type": "code", "params": {"workers": 1}}, "retries": 2,
                                     "turn_cost": 0.1}, seed=0, name="fix")
    yield env
    env.close()


def test_code_retry_feeds_the_failing_test_back_and_rewards_the_final_attempt(code_retry):
    task = code_retry.heldout(1)[0]
    episode = code_retry.reset(task)
    assert episode.messages[-1]["content"] == task.prompt
    observation, reward, done = episode.step("x+1000")
    assert not done and reward is None
    [feedback] = observation
    assert feedback["role"] == "user" and "Failing test: assert candidate(" in feedback["content"]
    observation, reward, done = episode.step(task.meta["canonical"])
    assert done and episode.correct
    assert reward == pytest.approx(1.0 - 0.1) and episode.components["turn_cost"] == pytest.approx(-0.1)


def test_code_retry_ends_after_its_retries_with_the_last_attempts_reward(code_retry):
    task = code_retry.heldout(1)[0]
    episode = code_retry.reset(task)
    results = [episode.step("x+1000") for _ in range(3)]
    assert [done for _, _, done in results] == [False, False, True]
    assert results[-1][1] == pytest.approx(0.2 - 0.2) and episode.correct is False  # compiles, tests fail
    scores = code_retry.score([task], [Response(task.meta["canonical"], "stop")])
    assert scores[0].correct


# ------------------------------------------------------------------ in the training loop


def agent_recipe(tmp_path, tiny_model_dir, **extra) -> list[str]:
    recipe = tmp_path / "agents.yaml"
    recipe.write_text(
        "imports: [" + str(REPO / "tests" / "agent_envs.py") + "]\n"
        "domains:\n  two: {type: two_turn_arith, params: {levels: [2]}, tools: [calculator]}\n"
    )
    return [
        "train", str(recipe), f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
        "train.total_steps=2", "train.prompts_per_step=2", "train.samples_per_prompt=2", "train.max_new_tokens=6",
        "eval.every_steps=0", "eval.num_problems=2", "eval.samples_per_problem=2", "eval.k=[1]",
        "run.progress=false", "rl.entropy_coef=0.01", "monitor.spot_check_every_steps=1", "monitor.spot_check_k=1",
        "train.minibatches=1", *[f"{k}={v}" for k, v in extra.items()],
    ]


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_multi_turn_domain_trains_and_its_episodes_are_stored_viewed_and_spot_checked(
        tiny_model_dir, tmp_path, staleness):
    from postrl.cli import main
    from postrl.store.query import query_view
    from postrl.store.rollouts import read_rows

    assert main(agent_recipe(tmp_path, tiny_model_dir, **{"pipeline.max_staleness": staleness})) == 0
    run_dir = tmp_path / "run"
    rows = read_rows(run_dir)
    assert len(rows) == 8
    for r in rows:
        assert r.turns and r.turns[0]["role"] == "assistant" and r.end_reason in ("done", "length", "max_turns")
        assert len(r.loss_mask) == len(r.token_ids) and r.tool_calls == 0
        if r.end_reason == "done":
            assert [t["role"] for t in r.turns] == ["assistant", "user", "assistant"]
            assert 0 in r.loss_mask
        sample = r.to_sample()
        assert sample.loss_mask == r.loss_mask and sample.episode.end_reason == r.end_reason
    view = query_view(run_dir, "tools_by_step")
    assert [row[0] for row in view.rows] == [0, 1] and view.rows[0][3] == 0.0  # tool_call_rate
    ends = query_view(run_dir, "episode_ends")
    assert sum(row[2] for row in ends.rows) == 8
    spot = (run_dir / "samples" / "step_1.md").read_text()
    assert "- episode: " in spot and "assistant (" in spot


def test_killed_run_with_episodes_in_flight_resumes_bitwise(tiny_model_dir, tmp_path):
    """Asynchronous (staleness 1): a checkpoint holds the next step's episodes in flight; a run
    killed after it and resumed ends with the weights and rollouts of an uninterrupted run."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from postrl.store.rollouts import read_rows

    def postrl(args, crash_at=""):
        env = {**os.environ, "POSTRL_CRASH_AT": crash_at}
        return subprocess.run([sys.executable, "-m", "postrl", *args], env=env, capture_output=True, text=True)

    def rows(run_dir):  # seconds measured on the host left out
        out = []
        for r in read_rows(run_dir):
            row = {k: v for k, v in vars(r).items() if k != "timings"}
            row["turns"] = [{k: v for k, v in t.items() if k != "seconds"} for t in r.turns]
            out.append(row)
        return out

    extra = {"train.total_steps": 4, "checkpoint.every_steps": 2, "pipeline.max_staleness": 1,
             "monitor.spot_check_every_steps": 0}
    (tmp_path / "ref").mkdir()
    reference = postrl(agent_recipe(tmp_path / "ref", tiny_model_dir, **extra))
    assert reference.returncode == 0, reference.stderr[-2000:]
    (tmp_path / "cut").mkdir()
    first = postrl(agent_recipe(tmp_path / "cut", tiny_model_dir, **extra), crash_at="step.stored:3")
    assert first.returncode == -9
    resumed = postrl(["train", "--resume", str(tmp_path / "cut" / "run")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    want = load_file(tmp_path / "ref" / "run" / "final" / "model.safetensors")
    got = load_file(tmp_path / "cut" / "run" / "final" / "model.safetensors")
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert rows(tmp_path / "cut" / "run") == rows(tmp_path / "ref" / "run")


def test_tools_on_an_environment_answer_calls_and_pass_the_rest_to_it(code_retry):
    env = ToolEnv(code_retry, DomainConfig(tools=["calculator"]), "fix")
    assert env.max_turns == 3 + 3 and env.stop == ("</tool_call>",)
    task = code_retry.heldout(1)[0]
    episode = env.reset(task)
    assert episode.messages[0]["role"] == "system" and "calculator(expression: str)" in episode.messages[0]["content"]
    observation, reward, done = episode.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}'
                                             '</tool_call>')
    assert observation[0]["content"] == "<tool_result>42</tool_result>" and not done
    observation, reward, done = episode.step(task.meta["canonical"])  # an attempt: graded by code_retry
    assert done and reward == pytest.approx(1.0) and episode.correct and "turn_cost" in episode.components


# ------------------------------------------------------------------ monitors


def episode_sample(calls: list[tuple[str, str]]):
    """A sample whose episode made these (call text, status) tool calls."""
    from postrl.records import Episode, Sample, Turn

    turns = []
    for text, status in calls:
        turns += [Turn("assistant", text, 5, tool="calculator"), Turn("tool", "r", 3, "calculator", status)]
    turns.append(Turn("assistant", "42", 2))
    return Sample(Task("mul", "t", "6*7=", "42"), 0, [1], [2], [0.0], "42", "stop", 1.0, 0,
                  episode=Episode(turns, "done"))


def test_tool_loop_monitor_fires_on_episodes_that_repeat_one_call():
    from postrl.monitor.on_episodes import ToolLoop
    from postrl.monitor.settings import ToolLoopConfig

    monitor = ToolLoop(ToolLoopConfig(min_repeats=3, max_share=0.25, patience_steps=2), None)
    looping = [episode_sample([("<tool_call>same</tool_call>", "ok")] * 3)] * 2 + [episode_sample([("a", "ok")])] * 2
    varied = [episode_sample([("a", "ok"), ("b", "ok"), ("c", "ok")])] * 4
    assert monitor.update(0, {}, varied) == [] and monitor.values["monitor/tool_loop_share"] == 0.0
    assert monitor.update(1, {}, looping) == []  # patience: the first bad step does not fire
    [alert] = monitor.update(2, {}, looping)
    assert "50% of episodes repeat one tool call" in alert.message
    assert monitor.update(3, {}, []) == []  # a step without episodes changes nothing


def test_tool_errors_monitor_fires_on_a_high_or_rising_error_rate():
    from postrl.monitor.on_episodes import ToolErrors
    from postrl.monitor.settings import ToolErrorsConfig

    monitor = ToolErrors(ToolErrorsConfig(max_rate=0.5, min_rise=0.2, window_steps=3), None)
    def step(errors):
        return [episode_sample([("c", "error" if i < errors else "ok") for i in range(10)])]

    assert monitor.update(0, {}, step(0)) == []
    assert monitor.update(1, {}, step(2)) == []
    [alert] = monitor.update(2, {}, step(4))  # 0% -> 20% -> 40%: risen 0.4 over the window, under the max
    assert monitor.values["monitor/tool_error_rate"] == pytest.approx(0.4) and "risen +0.40" in alert.message
    state = monitor.state_dict()
    again = ToolErrors(ToolErrorsConfig(max_rate=0.5, min_rise=0.2, window_steps=3), None)
    again.load_state_dict(state)
    assert again.update(3, {}, step(9)) == []  # still firing: stays quiet until the condition clears
