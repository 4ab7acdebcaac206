"""The tool registry, the documented call format, and running a call without ever crashing.

    TOOLS.names()                                   # calculator, python, and user tools
    tools = make_tools(["calculator"], ToolContext(timeout_s=5, output_chars=500))
    call = parse_call(text)                         # None (no call), a ToolCall, or a CallError (Hermes)
    result = run_call(call, tools, ctx)             # ToolResult(text, status), never raises

The Hermes call format, parsed here (Qwen2.5's and Hermes' chat templates ask for it too; the
other formats, Qwen3's, Llama 3.x's and Mistral's, are `postrl.tools.formats`, built on `json_call`):

    <tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>

A chat template that renders tools itself (it takes `tools=`: Qwen2.5, Hermes) describes them
from each tool's JSON schema (`Tool.schema`, `tool_schemas`); a model without one (SmolLM2, the
built-in models) gets `describe`'s system message.

Sampling of a Hermes turn stops at `</tool_call>`; the result comes back as the next observation,
`<tool_result>...</tool_result>`. A user tool is a typed Python function, registered by name in a
module the recipe imports (`imports:`); its signature and docstring are its description:

    from postrl.tools.base import register_tool

    @register_tool
    def lookup(word: str) -> str:
        '''The dictionary definition of a word.'''

Statuses a call gets: ok | error (the tool raised, or its program failed) | timeout |
output_limit (the python tool's output flooded) | malformed (the call could not be parsed or
its arguments do not fit) | unknown_tool. In-process tools (calculator, user functions) run in a
thread with the timeout: a user function that never returns is abandoned, not killed, so user
tools are trusted code; untrusted code goes through `python`, which runs in the sandbox.
This module knows nothing of episodes, environments or the policy.
"""

from __future__ import annotations

import inspect
import json
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from postrl.registry import Registry

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
TOOL_STATUSES = ("ok", "error", "timeout", "output_limit", "malformed", "unknown_tool")


@dataclass
class ToolContext:
    """What every tool of an episode is given: its limits, and the sandbox for code."""

    timeout_s: float = 10.0
    """Wall-clock limit of one call."""
    output_chars: int = 1000
    """Longest result shown to the model, in characters."""
    sandbox: Any = None
    """A `postrl.rewards.sandbox_handle.SandboxHandle` (the `python` tool runs there); None: no code tools."""


@dataclass
class ToolResult:
    text: str
    status: str = "ok"
    """One of TOOL_STATUSES."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallError:
    """A call that could not be parsed: its status (malformed) and why."""

    message: str


class Tool(Protocol):
    name: str
    description: str
    """One line for the prompt: `name(arg: type, ...) -> type: docstring`."""
    schema: dict[str, Any]
    """The tool as a JSON schema (`{"type": "function", "function": {...}}`), for chat templates
    that render tools themselves."""
    in_process: bool
    """True: run in a thread of this process under the timeout; False: the tool enforces it (sandbox)."""

    def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


TOOLS = Registry("tool")
"""Tool name -> the Tool."""


class FunctionTool:
    """A typed Python function as a tool: called with its JSON arguments, checked against its signature."""

    in_process = True

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        self.fn, self.name = fn, name or fn.__name__
        self.signature = inspect.signature(fn)
        doc = inspect.getdoc(fn) or ""
        params = ", ".join(f"{p.name}: {_type_name(p.annotation)}" for p in self.signature.parameters.values())
        ret = _type_name(self.signature.return_annotation)
        summary = doc.splitlines()[0] if doc else ""
        self.description = f"{self.name}({params}) -> {ret}: {summary}".rstrip(": ")
        hints = _type_hints(fn)  # resolves annotations written as strings (`from __future__ import annotations`)
        self.schema = function_schema(self.name, summary, {
            p.name: _JSON_TYPES.get(hints.get(p.name, p.annotation), "string") for p in self.signature.parameters.values()},
            [p.name for p in self.signature.parameters.values() if p.default is inspect.Parameter.empty])

    def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            bound = self.signature.bind(**arguments)
        except TypeError as e:
            return ToolResult(f"bad arguments for {self.name}: {e}", "malformed")
        return ToolResult(str(self.fn(*bound.args, **bound.kwargs)))


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError):  # an annotation that does not resolve: the schema says string
        return {}


def function_schema(name: str, description: str, params: dict[str, str], required: list[str]) -> dict[str, Any]:
    """The JSON schema chat templates take in `tools=` (transformers' format)."""
    properties = {k: {"type": t} for k, t in params.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


def _type_name(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty or annotation is inspect.Signature.empty:
        return "any"
    return getattr(annotation, "__name__", None) or str(annotation)


def register_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Register a typed function as a tool (decorator, with or without `name=`)."""

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        tool = FunctionTool(f, name)
        TOOLS.add(tool.name, tool)
        return f

    return deco(fn) if fn is not None else deco


def make_tools(names: list[str], key: str = "tools") -> dict[str, Tool]:
    """The registered tools by name; an unknown one raises ConfigError naming `key`."""
    return {n: TOOLS.get(n, key=key) for n in names}


def tool_schemas(tools: dict[str, Tool]) -> list[dict[str, Any]]:
    return [t.schema for t in tools.values()]


HERMES_HOW = f"To call one, write {CALL_OPEN}{{\"name\": NAME, \"arguments\": {{...}}}}{CALL_CLOSE} and stop"
"""How `describe` tells a model to call a tool in the Hermes format (`postrl.tools.formats` has the others)."""


def describe(tools: dict[str, Tool], how: str = HERMES_HOW) -> str:
    """The tools' system prompt: the call format (`how`, one sentence) and one line per tool."""
    lines = [f"You can call tools. {how}; its result comes back as {RESULT_OPEN}...{RESULT_CLOSE}. Tools:"]
    lines += [f"- {t.description}" for t in tools.values()]
    return "\n".join(lines)


def parse_call(text: str) -> ToolCall | CallError | None:
    """The first call in an assistant turn; None when the turn makes no call (an answer)."""
    calls = tagged_calls(text, most=1)
    return calls[0] if calls else None


def tagged_calls(text: str, most: int | None = None) -> list[ToolCall | CallError]:
    """The calls in `<tool_call>` tags of an assistant turn, in order, at most `most` of them; []
    when it makes none. An opening tag without its closing one is a CallError and ends the reading."""
    calls: list[ToolCall | CallError] = []
    pos = 0
    while (most is None or len(calls) < most) and (start := text.find(CALL_OPEN, pos)) >= 0:
        end = text.find(CALL_CLOSE, start)
        if end < 0:
            calls.append(CallError(f"no {CALL_CLOSE} after {CALL_OPEN}"))
            break
        calls.append(json_call(text[start + len(CALL_OPEN) : end].strip()))
        pos = end + len(CALL_CLOSE)
    return calls


def json_call(body: str, args_key: str = "arguments", also: tuple[str, ...] = ()) -> ToolCall | CallError:
    """`body`, one JSON call, decoded (`call_from`); text that is not JSON is a CallError saying where."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return CallError(f"the call is not JSON ({e.msg}, char {e.pos})")
    except RecursionError:  # thousands of nested brackets: the model's text, not the run's failure
        return CallError("the call is nested too deeply")
    return call_from(data, args_key, also)


def call_from(data: Any, args_key: str = "arguments", also: tuple[str, ...] = ()) -> ToolCall | CallError:
    """A decoded JSON call, `{"name": NAME, args_key: {...}}` (the arguments may sit under one of the
    `also` keys instead; none at all: no arguments); anything else is a CallError saying what it lacks."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return CallError(f'expected {{"name": NAME, "{args_key}": {{...}}}}')
    key = next((k for k in (args_key, *also) if k in data), args_key)
    args = data.get(key, {})
    if not isinstance(args, dict):
        return CallError(f"{key} must be a JSON object")
    return ToolCall(data["name"], args)


def run_call(call: ToolCall | CallError, tools: dict[str, Tool], ctx: ToolContext) -> ToolResult:
    """Run a parsed call: an error result (with its status) for whatever goes wrong, never an exception."""
    if isinstance(call, CallError):
        return ToolResult(f"malformed tool call: {call.message}", "malformed")
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"unknown tool {call.name!r} (tools: {', '.join(tools) or 'none'})", "unknown_tool")
    result = _in_thread(tool, call.arguments, ctx) if tool.in_process else _guarded(tool, call.arguments, ctx)
    return ToolResult(truncate(result.text, ctx.output_chars), result.status)


def _guarded(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    try:
        return tool(arguments, ctx)
    except Exception as e:  # a tool's failure is the model's observation, not the run's crash
        return ToolResult(f"{type(e).__name__}: {e}", "error")


def _in_thread(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    box: list[ToolResult] = []
    thread = threading.Thread(target=lambda: box.append(_guarded(tool, arguments, ctx)), daemon=True,
                              name=f"tool-{tool.name}")
    thread.start()
    thread.join(ctx.timeout_s)
    if not box:  # still running: abandoned (daemon), the episode goes on
        return ToolResult(f"{tool.name} timed out after {ctx.timeout_s:g}s", "timeout")
    return box[0]


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"...[{len(text) - limit} chars cut]"
    return text[: max(0, limit - len(marker))] + marker
