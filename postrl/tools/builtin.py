"""The built-in tools: `calculator` (safe arithmetic) and `python` (code in the sandbox pool).

    calculator  {"expression": "123*45"}        -> "5535"
    python      {"code": "print(sum(range(10)))"} -> "45\n" (stdout, then stderr / the traceback)

The calculator walks the expression's syntax tree and evaluates numbers and + - * / // % ** and
parentheses only, nothing else (no names, calls or attributes: it never evaluates code), with
exponents and results bounded so that no expression can run long. The python tool hands the
code to the sandbox (`postrl.sandbox`: isolation, rlimits, wall-clock timeout, output cap), so an
infinite loop, a fork bomb or an output flood comes back as a status, not a hang.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from postrl.sandbox.runs import RunRequest
from postrl.tools.base import TOOLS, ToolContext, ToolResult, function_schema, truncate

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 100
MAX_DIGITS = 1000


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError for anything else.

    >>> calculate("123*45")
    5535
    >>> calculate("(2+3)**2 / 5")
    5.0
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is over {MAX_EXPONENT}")
        out = _BINARY[type(node.op)](left, right)
        if isinstance(out, int) and abs(out).bit_length() > MAX_DIGITS * 3.33:
            raise ValueError("result too large")
        return out
    raise ValueError(f"not allowed in an arithmetic expression: {type(node).__name__}")


class Calculator:
    name = "calculator"
    description = 'calculator(expression: str) -> str: the value of an arithmetic expression, e.g. "123*45"'
    schema = function_schema("calculator", 'The value of an arithmetic expression, e.g. "123*45".',
                             {"expression": "string"}, ["expression"])
    in_process = True

    def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str) or set(arguments) != {"expression"}:
            return ToolResult('calculator takes {"expression": "<arithmetic>"}', "malformed")
        try:
            value = calculate(expression)
        except (ValueError, ZeroDivisionError, OverflowError) as e:
            return ToolResult(f"{type(e).__name__}: {e}", "error")
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            value = int(value)
        return ToolResult(str(value))


class PythonTool:
    name = "python"
    description = "python(code: str) -> str: run a Python program; its stdout, stderr and any exception"
    schema = function_schema("python", "Run a Python program; returns its stdout, stderr and any exception.",
                             {"code": "string"}, ["code"])
    in_process = False  # the sandbox enforces the timeout and the limits

    def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or set(arguments) != {"code"}:
            return ToolResult('python takes {"code": "<program>"}', "malformed")
        if ctx.sandbox is None:
            return ToolResult("python: no sandbox in this environment", "error")
        req = RunRequest(code, timeout_s=ctx.timeout_s, max_output_bytes=max(4096, 4 * ctx.output_chars))
        result = ctx.sandbox.get().run_many([req])[0]
        text = result.stdout + (("\n" if result.stdout else "") + result.stderr if result.stderr else "")
        text = truncate(text, max(0, ctx.output_chars - 40))  # room for the status note after it
        if result.status == "timeout":
            return ToolResult(f"{text}\n[timed out after {ctx.timeout_s:g}s]".lstrip(), "timeout")
        if result.status == "output_limit":
            return ToolResult(f"{text}\n[output limit reached]", "output_limit")
        if result.status != "finished":
            return ToolResult(f"{text}\n[{result.status}: {result.message}]".lstrip(), "error")
        if result.exit_code != 0:
            return ToolResult(text or f"[exit code {result.exit_code}]", "error")
        return ToolResult(text)


TOOLS.add("calculator", Calculator())
TOOLS.add("python", PythonTool())
