"""Answer extraction: the part of a reply that a verifier grades, chosen by name.

    extract("boxed", "so \\\\boxed{\\\\frac{1}{2}}")        # '\\\\frac{1}{2}'
    make_extractor("tag:answer")("<answer> 7 </answer>")  # '7'

A `<think>...</think>` section is removed before any extractor looks at the reply, so an answer
that appears only inside the reasoning is not an answer (an unclosed `<think>` removes the rest).
Every extractor returns the extracted text, or None when the reply has no answer in the
requested form (graded as wrong, not as "could not verify"). `boxed`, `hash` and `tag:NAME` take
the last answer in their form, and none when the reply gives several different ones: a reply
that hedges over candidates (`\\boxed{84} \\boxed{85}`) has not answered (the hack library,
`postrl.rewards.checks.hacks`, checks this).

    >>> extract("boxed", "\\\\boxed{1} then \\\\boxed{1}, so \\\\boxed{\\\\frac{a}{\\\\sqrt{b}}}")   # several: none
    >>> extract("boxed", "so \\\\boxed{\\\\frac{a}{\\\\sqrt{b}}}, that is \\\\boxed{ \\\\frac{a}{\\\\sqrt{b}} }")   # nested braces
    '\\\\frac{a}{\\\\sqrt{b}}'
    >>> extract("hash", "48/2 = 24 clips in May.\\n#### 72")
    '72'
    >>> extract("tag:answer", "<answer>3</answer> or rather <answer> 4 </answer>") is None
    True
    >>> extract("last_number", "She pays $1,250.50, then 3 more")
    '3'
    >>> extract("code_fence", "```python\\ndef f(): pass\\n```\\nand\\n```\\nprint(1)\\n```")
    'print(1)\\n'
    >>> extract("code_fence", "def f(): pass")               # no fence: the whole reply is the code
    'def f(): pass'
    >>> extract("boxed", "<think>\\\\boxed{5}</think> I am not sure.") is None
    True
    >>> extract("none", "<think>hm</think> 42 ")
    '42'
"""

from __future__ import annotations

import re
from collections.abc import Callable

from postrl.errors import ConfigError
from postrl.registry import Registry
from postrl.rewards.terms import register_term

Extractor = Callable[[str], "str | None"]

EXTRACTORS = Registry("answer extractor")
"""Name -> factory(argument) -> Extractor. `tag:NAME` is the entry `tag` with the argument NAME;
the others take no argument. The config key is `domains.NAME.params.extract`."""

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_HASH = re.compile(r"####\s*([^\n]*)")
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_TAG_NAME = re.compile(r"[A-Za-z_][\w\-]*")
_BOX = re.compile(r"\\(?:boxed|fbox)\{")


def strip_think(text: str) -> str:
    """The reply without its `<think>...</think>` sections (an unclosed one runs to the end)."""
    return _THINK.sub("", text)


def _register(name: str, takes_argument: bool = False):
    def deco(fn):
        fn.takes_argument = takes_argument
        return EXTRACTORS.register(name)(fn)

    return deco


def _one_answer(found: list[str]) -> str | None:
    """The last of the answers found, or None when there are none or several different ones."""
    return found[-1] if found and len(set(found)) == 1 else None


def all_boxed(text: str) -> list[str]:
    """The stripped content of every closed `\\boxed{...}` / `\\fbox{...}`, nested braces balanced, in order."""
    found = []
    for m in _BOX.finditer(text):
        depth = 1
        for j in range(m.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                found.append(text[m.end():j].strip())
                break
    return found


@_register("boxed")
def _boxed(_: str) -> Extractor:
    """The content of the last `\\boxed{...}`, nested braces balanced; none if the boxes differ."""

    def run(text: str) -> str | None:
        return _one_answer(all_boxed(text))

    return run


@_register("hash")
def _hash(_: str) -> Extractor:
    """GSM8K's final line: what follows the last `####`, commas in numbers dropped."""

    def run(text: str) -> str | None:
        found = [f.strip().replace(",", "") for f in _HASH.findall(text)]
        return _one_answer(found) or None

    return run


@_register("tag", takes_argument=True)
def _tag(name: str) -> Extractor:
    """The stripped content of the last `<NAME>...</NAME>`."""
    pattern = re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.DOTALL)

    def run(text: str) -> str | None:
        return _one_answer([f.strip() for f in pattern.findall(text)])

    return run


@_register("last_number")
def _last_number(_: str) -> Extractor:
    """The last number in the reply (`3/4` is one), thousands separators dropped: `-1,250.5` -> `-1250.5`."""

    def run(text: str) -> str | None:
        found = _NUMBER.findall(text)
        return found[-1].replace(",", "") if found else None

    return run


@_register("code_fence")
def _code_fence(_: str) -> Extractor:
    """The body of the last fenced block (```python ... ```); no fence: the whole reply."""

    def run(text: str) -> str | None:
        found = _FENCE.findall(text)
        return found[-1] if found else text

    return run


@_register("none")
def _none(_: str) -> Extractor:
    """The whole reply (after the think section), stripped."""
    return str.strip


def check_extractor(spec: str, key: str = "") -> None:
    """ConfigError naming `key` unless `spec` names an extractor (`tag:NAME` with a valid NAME)."""
    name, sep, arg = spec.partition(":")
    EXTRACTORS.check(name, key)
    factory = EXTRACTORS.get(name)
    if factory.takes_argument and not _TAG_NAME.fullmatch(arg):
        raise ConfigError(f"config key '{key}' = {spec!r}: expected {name}:NAME, NAME a tag name such as answer")
    if sep and not factory.takes_argument:
        raise ConfigError(f"config key '{key}' = {spec!r}: the extractor {name} takes no argument")


class ExtractorNames:
    """What `postrl.names` checks `domains.NAME.params.extract` against."""

    def check(self, name: str, key: str = "") -> None:
        check_extractor(name, key)


def make_extractor(spec: str, key: str = "") -> Extractor:
    """The extractor named `spec`, applied after the think section is removed."""
    check_extractor(spec, key)
    name, _, arg = spec.partition(":")
    inner = EXTRACTORS.get(name)(arg)
    return lambda text: inner(strip_think(text))


def extract(spec: str, text: str) -> str | None:
    """`make_extractor(spec)(text)`."""
    return make_extractor(spec)(text)


def follows_format(spec: str, text: str) -> bool:
    """Whether the reply gives an answer in the form `spec` asks for: a non-empty extraction, and
    for `code_fence` an actual fence (its fallback to the whole reply is not the format).

    >>> follows_format("boxed", "so \\\\boxed{4}"), follows_format("code_fence", "print(1)")
    (True, False)
    """
    if spec.partition(":")[0] == "code_fence":
        return bool(_FENCE.search(strip_think(text)))
    return bool((make_extractor(spec)(text) or "").strip())


@register_term("format")
def format_term(tasks, responses) -> list[float]:
    """1 when the reply follows the format its domain's extractor asks for (`Task.meta["extract"]`,
    set by dataset domains; `boxed` for a task that names none), paid separately from correctness:
    `reward: {reward: 1.0, format: 0.1}`."""
    return [float(follows_format(t.meta.get("extract") or "boxed", r.text)) for t, r in zip(tasks, responses)]
