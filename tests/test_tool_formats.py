"""Tool-call formats beyond Hermes (Qwen3, Llama 3.x, Mistral): each parsed on replies written in
it, malformed ones included, every failure a recorded status; the format chosen by `tool_format`
or read from the chat template; and Hermes, the default for every current recipe, unchanged."""

from __future__ import annotations

import json
import random

import pytest
import torch

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.config.schema import DomainConfig
from postrl.errors import ConfigError
from postrl.names import check_names
from postrl.sampling.episodes import EpisodeLimits, sample_episodes
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import make_domain
from postrl.tasks.env import MAX_CALLS_PER_TURN, ToolEnv
from postrl.tools.base import CallError, ToolCall
from postrl.tools.formats import TOOL_FORMATS, detect_format, resolve_format


def env_for(tool_format: str = "auto") -> ToolEnv:
    return ToolEnv(make_domain("mul", {}, seed=0, name="mul"), DomainConfig(tools=["calculator"], tool_format=tool_format),
                   "mul")


def statuses(tool_format: str, text: str) -> list[str] | None:
    """The statuses of the tool turns a reply gets in an episode of `tool_format`; None: an answer
    (the episode ends and the domain grades it)."""
    env = env_for(tool_format)
    observation, reward, done = env.reset(env.heldout(1)[0]).step(text)
    if done:
        assert observation is None and reward is None
        return None
    assert not done and reward is None and all(m["role"] == "tool" for m in observation)
    assert all(m["content"].startswith("<tool_result>") for m in observation)
    return [m["status"] for m in observation]


CALC = {"name": "calculator", "arguments": {"expression": "2+2"}}
LLAMA_CALC = json.dumps({"name": "calculator", "parameters": {"expression": "2+2"}})
BAD_JSON, NO_NAME, BAD_ARGS = "{name: calculator}", '{"arguments": {"expression": "1"}}', '{"name": "calculator", "arguments": 3}'
UNKNOWN = '{"name": "rm_rf", "arguments": {}}'

# format -> [(a reply written in it, the statuses its tool turns get; None: an answer)]
REPLIES = {
    "qwen3": [
        (f"<tool_call>\n{json.dumps(CALC)}\n</tool_call>", ["ok"]),
        (f"<think>\nI should add.\n</think>\n\nLet me add.\n<tool_call>\n{json.dumps(CALC)}\n</tool_call>", ["ok"]),
        (f"<tool_call>\n{json.dumps(CALC)}\n</tool_call>\n<tool_call>\n{UNKNOWN}\n</tool_call>", ["ok", "unknown_tool"]),
        (f"<tool_call>{BAD_JSON}</tool_call>", ["malformed"]),
        (f"<tool_call>{NO_NAME}</tool_call>", ["malformed"]),
        (f"<tool_call>{BAD_ARGS}</tool_call>", ["malformed"]),
        (f"<tool_call>{json.dumps(CALC)}</tool_call><tool_call>{json.dumps(CALC)}", ["ok", "malformed"]),  # never closed
        (f"<think>maybe <tool_call>{json.dumps(CALC)}</tool_call>? no.</think>\n\n4", None),  # a call inside the thought
        (f"thinking the prompt opened</think><tool_call>{json.dumps(CALC)}</tool_call>", ["ok"]),
        (f"<think>unclosed <tool_call>{json.dumps(CALC)}</tool_call>", None),
        ("The answer is 4.", None),
    ],
    "llama3": [
        (LLAMA_CALC, ["ok"]),
        (f"<|python_tag|>{LLAMA_CALC}", ["ok"]),
        (json.dumps(CALC), ["ok"]),  # "arguments" accepted for "parameters"
        (json.dumps({"type": "function", **CALC}), ["ok"]),
        (f"{LLAMA_CALC}; {UNKNOWN}", ["ok", "unknown_tool"]),
        (f"{LLAMA_CALC} and then I will answer.", ["ok"]),  # text after the call: ignored (Llama ends with <|eom_id|>)
        (f"Let me compute. {LLAMA_CALC}", None),  # prose first: an answer, not a call
        ('<|python_tag|>calculator.call(expression="2+2")', ["ok"]),
        ('Sure.<|python_tag|>calculator.call(expression="2+2")', ["ok"]),
        ("<|python_tag|>calculator.call(expression=__import__('os'))", ["malformed"]),  # literals only, never evaluated
        ("<|python_tag|>print(1)", ["malformed"]),
        ("<|python_tag|>{not json", ["malformed"]),
        (BAD_JSON, ["malformed"]),
        ('{"parameters": {"expression": "1"}}', ["malformed"]),  # no name
        ('{"name": "calculator", "parameters": [1]}', ["malformed"]),
        ('{"name": "calculator", "parameters": {"expr": "1"}}', ["malformed"]),  # arguments that do not fit
        ('{"answer": 4}', None),  # JSON that names no call: an answer
        ("4", None),
    ],
    "mistral": [
        (f"[TOOL_CALLS][{json.dumps(CALC)}]", ["ok"]),
        (f"[TOOL_CALLS][{json.dumps(CALC)}, {UNKNOWN}]", ["ok", "unknown_tool"]),
        (f"I will use the calculator.[TOOL_CALLS][{json.dumps(CALC)}]", ["ok"]),
        (f"[{json.dumps(CALC)}]", ["ok"]),  # [TOOL_CALLS] decoded away (a special token)
        ('[TOOL_CALLS]calculator[ARGS]{"expression": "2+2"}', ["ok"]),
        ('[TOOL_CALLS]calculator[CALL_ID]a1b2c3d4e[ARGS]{"expression": "2+2"}[TOOL_CALLS]rm_rf[ARGS]{}',
         ["ok", "unknown_tool"]),
        ('calculator{"expression": "2+2"}', ["ok"]),  # [TOOL_CALLS] and [ARGS] decoded away
        ("[TOOL_CALLS][{name: calculator}]", ["malformed"]),
        ("[TOOL_CALLS][]", ["malformed"]),
        (f"[TOOL_CALLS][{NO_NAME}]", ["malformed"]),
        (f"[TOOL_CALLS][{BAD_ARGS}]", ["malformed"]),
        ('[TOOL_CALLS][ARGS]{"expression": "1"}', ["malformed"]),
        ("[TOOL_CALLS]calculator[ARGS]{oops", ["malformed"]),
        ("[TOOL_CALLS]just words", ["malformed"]),
        ("[1, 2, 3]", None),
        ("4", None),
    ],
    "hermes": [
        (f"<tool_call>{json.dumps(CALC)}</tool_call>", ["ok"]),
        (f"Let me add. <tool_call>{json.dumps(CALC)}</tool_call>", ["ok"]),
        (f"<tool_call>{json.dumps(CALC)}</tool_call><tool_call>{UNKNOWN}</tool_call>", ["ok"]),  # one call a turn
        (f"<tool_call>{BAD_JSON}</tool_call>", ["malformed"]),
        (f"<tool_call>{NO_NAME}</tool_call>", ["malformed"]),
        (f"<tool_call>{UNKNOWN}</tool_call>", ["unknown_tool"]),
        ("4", None),
    ],
}


@pytest.mark.parametrize("tool_format, text, want", [(f, t, w) for f, cases in REPLIES.items() for t, w in cases])
def test_replies_in_each_format_get_their_calls_run_or_a_status(tool_format, text, want):
    assert statuses(tool_format, text) == want


def test_a_call_in_each_format_returns_the_tools_result():
    for tool_format, text in [("qwen3", REPLIES["qwen3"][1][0]), ("llama3", LLAMA_CALC),
                              ("mistral", '[TOOL_CALLS]calculator[ARGS]{"expression": "6*7"}')]:
        env = env_for(tool_format)
        [turn] = env.reset(env.heldout(1)[0]).step(text)[0]
        assert turn["tool"] == "calculator" and turn["content"] == ("<tool_result>42</tool_result>" if "6*7" in text
                                                                   else "<tool_result>4</tool_result>")


def test_more_calls_than_a_turn_may_run_get_one_malformed_observation():
    call = f"<tool_call>{json.dumps(CALC)}</tool_call>"
    got = statuses("qwen3", call * (MAX_CALLS_PER_TURN + 3))
    assert got == ["ok"] * MAX_CALLS_PER_TURN + ["malformed"]


def test_parsing_never_raises_on_hostile_text():
    rng = random.Random(0)
    alphabet = '{}[]":,;<>|/ \n\\abcnmetolrg_TOOLCALS()=.0123456789'
    pieces = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", '"name"']
    texts = ["[" * 5000, "{" * 5000, '{"name": ' + "[" * 100_000, "<|python_tag|>" + "(" * 5000, "[TOOL_CALLS]" + "[" * 5000,
             "<|python_tag|>x.call(a=" + "[" * 5000 + ")", "<tool_call>" + "[" * 100_000 + "</tool_call>"]
    texts += ["".join(rng.choice(pieces) if rng.random() < 0.2 else rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
              for _ in range(3000)]
    for name in TOOL_FORMATS.names():
        parse = TOOL_FORMATS.get(name).parse
        for text in texts:
            calls = parse(text)
            assert isinstance(calls, list) and all(isinstance(c, (ToolCall, CallError)) for c in calls)


# ------------------------------------------------------------------ choosing the format

QWEN25 = ("{%- if tools %}For each function call, return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags{%- endif %}<|im_start|>assistant\n")
QWEN3 = QWEN25 + "{%- if '</think>' in message.content %}<think>\n{%- endif %}"
LLAMA31 = ("<|start_header_id|>ipython<|end_header_id|>\n\n{{- '<|python_tag|>' + tool_call.name + '.call(' }}"
           'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.')
LLAMA32 = '<|start_header_id|>ipython<|end_header_id|>\n\n{"name": function name, "parameters": ...}'
MISTRAL = "{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}{%- endif %}[AVAILABLE_TOOLS]"
SMOLLM2 = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>{% endfor %}"


@pytest.mark.parametrize("template, want", [
    (None, "hermes"), ("", "hermes"), (SMOLLM2, "hermes"), (QWEN25, "hermes"), (QWEN3, "qwen3"),
    (LLAMA31, "llama3"), (LLAMA32, "llama3"), (MISTRAL, "mistral"), ({"default": SMOLLM2, "tool_use": MISTRAL}, "mistral"),
])
def test_auto_reads_the_format_from_the_chat_template(template, want):
    assert detect_format(template) == want
    assert resolve_format("auto", template).name == want
    assert resolve_format("hermes", template).name == "hermes"  # a named format is never overridden


def test_auto_is_hermes_exactly_as_before_until_a_template_says_otherwise():
    env = env_for()
    assert DomainConfig().tool_format == "auto" and env.format.name == "hermes" and env.stop == ("</tool_call>",)
    assert env.reset(env.heldout(1)[0]).messages[0]["content"] == (
        'You can call tools. To call one, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call> and stop; '
        "its result comes back as <tool_result>...</tool_result>. Tools:\n"
        '- calculator(expression: str) -> str: the value of an arithmetic expression, e.g. "123*45"')
    env.use_chat_template(SMOLLM2)
    assert env.format.name == "hermes" and env.stop == ("</tool_call>",)
    env.use_chat_template(LLAMA31)
    assert env.format.name == "llama3" and env.stop == ()
    assert '{"name": NAME, "parameters": {...}}' in env.reset(env.heldout(1)[0]).messages[0]["content"]
    pinned = env_for("mistral")
    pinned.use_chat_template(LLAMA31)
    assert pinned.format.name == "mistral" and "[TOOL_CALLS]" in pinned.reset(pinned.heldout(1)[0]).messages[0]["content"]


def test_the_episode_runner_hands_environments_the_models_chat_template(tiny_model_dir):
    """A template that does not render tools and asks for Llama's format: the tools' system
    message describes Llama's call, and no turn stops at Hermes' closing tag."""
    model, tok = load_model(str(tiny_model_dir))
    tok.chat_template = ("{# <|start_header_id|>ipython<|end_header_id|> #}"
                         "{% for m in messages %}{{ m['content'] }}={% endfor %}{% if add_generation_prompt %}+{% endif %}")
    seen = []
    render = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: seen.append(messages) or render(messages, **kw)
    env = env_for()
    task = env.heldout(1)[0]
    sample_episodes(Policy(model, tok), [task], 1, {"mul": env}, lambda t: EpisodeLimits(6), GenParams(6), torch.Generator())
    assert env.format.name == "llama3" and env.stop == ()
    assert seen[0][0]["role"] == "system" and '{"name": NAME, "parameters": {...}}' in seen[0][0]["content"]


def test_an_unknown_tool_format_is_a_config_error_naming_the_key_and_the_choices():
    cfg = load_config("recipes/default.yaml", ["domains.arith.tools=[calculator]", "domains.arith.tool_format=llama"])
    with pytest.raises(ConfigError, match=r"config key 'domains.arith.tool_format' = 'llama': unknown tool format; "
                                          r"did you mean 'llama3'\? \(expected one of: auto, hermes, llama3, mistral, qwen3\)"):
        check_names(cfg)
    with pytest.raises(ConfigError, match="domains.mul.tool_format"):
        ToolEnv(make_domain("mul"), DomainConfig(tools=["calculator"], tool_format="llama"), "mul")
    for name in ("auto", *TOOL_FORMATS.names()):
        check_names(load_config("recipes/default.yaml", [f"domains.arith.tool_format={name}"]))

