"""Tool-call formats: how a model writes its calls, how it is told to, where its turn stops, and
which chat template asks for which. A domain picks one with `tool_format:` (default `auto`: the
format the model's chat template asks for).

    fmt = TOOL_FORMATS.get("llama3")
    fmt.parse(text)                      # [] (no call: an answer), else a ToolCall or CallError per call, in order
    fmt.describe(tools)                  # the system message of a model whose template does not render tools
    fmt.stop                             # strings that end a turn with a call (kept in the text parsed)
    resolve_format("auto", chat_template)   # the format the template asks for; hermes without one

hermes   `<tool_call>{"name": N, "arguments": {...}}</tool_call>`. A turn stops at `</tool_call>`,
         so it makes one call (the first is parsed, as postrl always has). Hermes 2 Pro, Qwen2.5.
qwen3    The same JSON in `<tool_call>`, one or more calls a turn, after an optional thought.
         Qwen3's chat template (Qwen/Qwen3-* tokenizer_config.json) writes each call as
         `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`, several joined by newlines,
         its reasoning before them in `<think>...</think>`, and gives results back as `<tool_response>`
         blocks of one user turn; Qwen's function-calling guide (QwenLM/Qwen3,
         docs/source/framework/function_call.md) advises against stop words for its reasoning models,
         since a thought may contain them. So: no stop string (the turn ends at EOS), the thought is
         removed first (a call inside it is not a call; `</think>` alone ends a thought the prompt
         opened), and every call of the turn runs, in order.
llama3   Llama 3.1/3.2/3.3 JSON tool calling: the whole reply is `{"name": N, "parameters": {...}}`
         ("arguments" accepted too), optionally after `<|python_tag|>`, several joined by `;`; and
         3.1's built-in-tool form `<|python_tag|>NAME.call(key=value, ...)` (literal values). Text
         after the calls is ignored: Llama ends a call with `<|eom_id|>`, a special token.
mistral  `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]` (v3 tokenizers: Mistral 7B v0.3,
         Nemo) and `[TOOL_CALLS]NAME[ARGS]{...}`, once per call (v11 and later: Mistral Small 3.2,
         Magistral, Devstral; the form llama.cpp's common/chat.cpp parses for them).

`Policy.decode` skips special tokens, so where `<|python_tag|>`, `[TOOL_CALLS]` or `[ARGS]` is one
the parser sees the reply without it: llama3 reads the bare JSON (Llama's documented form anyway);
mistral reads a reply that opens with a JSON list of objects, or with `NAME{...}`, as calls.

Auto-detection reads the template's text, first match wins (llama.cpp's common/chat.cpp tells the
same families apart by the same marks): `[TOOL_CALLS]` -> mistral; the `ipython` header or
`<|python_tag|>` -> llama3; `<tool_call>` with `<think>` -> qwen3 (QwQ too); anything else,
no template included (SmolLM2, the built-in models), -> hermes.

Every way a call can be wrong (not JSON, no name, arguments that are not an object, an unclosed
tag) is a CallError, which `run_call` answers with a `malformed` observation; an unknown name is
`unknown_tool` there. Parsing never raises. This module knows no episode and no tokenizer.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from postrl.registry import Registry
from postrl.rewards.extract import strip_think
from postrl.tools.base import (
    CALL_CLOSE,
    CALL_OPEN,
    HERMES_HOW,
    CallError,
    Tool,
    ToolCall,
    call_from,
    describe,
    tagged_calls,
)

AUTO = "auto"
"""`tool_format: auto`: the format the model's chat template asks for (`detect_format`)."""

Calls = list[ToolCall | CallError]


@dataclass(frozen=True)
class ToolFormat:
    name: str
    parse: Callable[[str], Calls]
    """The calls of an assistant turn, in order; [] when it makes none (an answer). Never raises."""
    how: str
    """The sentence of the system message that says how to write a call (`describe`)."""
    stop: tuple[str, ...] = ()
    """Strings that end a turn with a call (none: the turn ends at EOS)."""

    def describe(self, tools: dict[str, Tool]) -> str:
        return describe(tools, self.how)


TOOL_FORMATS = Registry("tool format")
"""Format name -> its ToolFormat (`domains.NAME.tool_format`)."""


def register_format(fmt: ToolFormat) -> ToolFormat:
    TOOL_FORMATS.add(fmt.name, fmt)
    return fmt


# ------------------------------------------------------------------ hermes and qwen3: <tool_call> tags


def parse_hermes(text: str) -> Calls:
    return tagged_calls(text, most=1)  # the first call only, as the Hermes turn stops at its close tag


THINK_CLOSE = "</think>"


def parse_qwen3(text: str) -> Calls:
    return tagged_calls(strip_think(text.rsplit(THINK_CLOSE, 1)[-1]))  # after the last thought; an unclosed one hides the rest


# ------------------------------------------------------------------ llama3: the reply is the call

PYTHON_TAG = "<|python_tag|>"
_CALL_KEYS = {"name", "parameters", "arguments"}


def parse_llama3(text: str) -> Calls:
    reply = text.strip()
    tagged = PYTHON_TAG in reply
    if tagged:
        reply = reply.split(PYTHON_TAG, 1)[1].strip()
        if not reply.startswith("{"):
            return [builtin_call(reply)]
    elif not reply.startswith("{"):
        return []  # prose, or prose before JSON: an answer (Llama's call is the whole reply)
    values = json_values(reply, separator=";")
    if not tagged and isinstance(values[0], dict) and not _CALL_KEYS & values[0].keys():
        return []  # a JSON answer that names no call
    return [v if isinstance(v, CallError) else call_from(v, "parameters", ("arguments",)) for v in values]


def json_values(body: str, separator: str = "") -> list[Any]:
    """The JSON values at the start of `body`, joined by `separator` (none: the first value only);
    text after the last one is ignored. A value that does not decode ends the list as a CallError."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(body) and body[pos].isspace():
            pos += 1
        try:
            value, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            return [*out, CallError(f"the call is not JSON ({e.msg}, char {e.pos})")]
        except RecursionError:  # thousands of nested brackets: the model's text, not our failure
            return [*out, CallError("the call is nested too deeply")]
        out.append(value)
        rest = body[pos:].lstrip()
        if not separator or not rest.startswith(separator):
            return out
        pos = len(body) - len(rest) + len(separator)


def builtin_call(body: str) -> ToolCall | CallError:
    """Llama 3.1's built-in-tool call, `NAME.call(key=value, ...)`, values Python literals (read
    from the syntax tree, never evaluated)."""
    try:
        with warnings.catch_warnings():  # the model's `"\<"` would warn of an invalid escape on every call
            warnings.simplefilter("ignore")
            node = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return CallError(f"after {PYTHON_TAG}: neither JSON nor NAME.call(key=value, ...) ({type(e).__name__})")
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call"
            and isinstance(node.func.value, ast.Name) and not node.args and all(k.arg for k in node.keywords)):
        return CallError(f"after {PYTHON_TAG}: expected NAME.call(key=value, ...)")
    try:
        return ToolCall(node.func.value.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords})
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return CallError(f"the arguments of {node.func.value.id}.call(...) must be literals")


# ------------------------------------------------------------------ mistral: [TOOL_CALLS]

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_LIST_START = re.compile(r"\[\s*\{")
_BARE_CALL = re.compile(r"([A-Za-z_][\w.-]*)\s*(?=\{)")  # NAME{...}: the v11 form, its markers decoded away


def parse_mistral(text: str) -> Calls:
    if TOOL_CALLS in text:
        segments = text.split(TOOL_CALLS)[1:]
    else:  # the marker, a special token, may have been decoded away: a reply that opens like a call is one
        reply = text.strip()
        if not (_LIST_START.match(reply) or _BARE_CALL.match(reply)):
            return []
        segments = [reply]
    return [call for segment in segments for call in mistral_segment(segment.strip())]


def mistral_segment(segment: str) -> Calls:
    """What follows one `[TOOL_CALLS]`: a JSON list of calls, or NAME[ARGS]{...} (NAME{...})."""
    if segment.startswith("["):
        [value] = json_values(segment)
        if isinstance(value, CallError):
            return [value]
        if not value:
            return [CallError("an empty list of calls")]
        return [call_from(v) for v in value]
    name, sep, args = segment.partition(ARGS)
    if not sep and (bare := _BARE_CALL.match(segment)):
        name, args = bare.group(1), segment[bare.end() :]
    elif not sep:
        return [CallError(f'expected {TOOL_CALLS}[{{"name": NAME, "arguments": {{...}}}}] or {TOOL_CALLS}NAME{ARGS}{{...}}')]
    name = name.split(CALL_ID, 1)[0].strip()
    [value] = json_values(args)
    if not name:
        return [CallError(f"no tool name before {ARGS}")]
    return [value if isinstance(value, CallError) else call_from({"name": name, "arguments": value})]


# ------------------------------------------------------------------ the registry, and detection

HERMES = register_format(ToolFormat("hermes", parse_hermes, HERMES_HOW, (CALL_CLOSE,)))
register_format(ToolFormat("qwen3", parse_qwen3, f'To call one or more, write each call as {CALL_OPEN}{{"name": '
                           f'NAME, "arguments": {{...}}}}{CALL_CLOSE} (after any thinking) and end your turn'))
register_format(ToolFormat("llama3", parse_llama3, 'To call one, reply with only {"name": NAME, "parameters": '
                           '{...}} and end your turn'))
register_format(ToolFormat("mistral", parse_mistral, f'To call one or more, reply with {TOOL_CALLS}[{{"name": NAME, '
                           f'"arguments": {{...}}}}, ...] and end your turn'))

_DETECTION = (  # (format, marks that must all be in the template); the first match wins
    ("mistral", (TOOL_CALLS,)),
    ("llama3", ("<|start_header_id|>ipython<|end_header_id|>",)),
    ("llama3", (PYTHON_TAG,)),
    ("qwen3", (CALL_OPEN, "<think>")),
)


def detect_format(chat_template: str | dict | None) -> str:
    """The format a chat template asks for; hermes when it has no tool marks, or there is none."""
    text = "\n".join(chat_template.values()) if isinstance(chat_template, dict) else chat_template or ""
    return next((name for name, marks in _DETECTION if all(m in text for m in marks)), HERMES.name)


def resolve_format(setting: str, chat_template: str | dict | None, key: str = "") -> ToolFormat:
    """The format `tool_format: setting` means for a model with this chat template; an unknown
    name raises ConfigError naming `key`."""
    return TOOL_FORMATS.get(detect_format(chat_template) if setting == AUTO else setting, key=key)
