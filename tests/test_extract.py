"""Answer extractors on hand-made replies, and the `format` reward term."""

from __future__ import annotations

import doctest

import pytest

import postrl.rewards.extract as extract_module
from postrl.errors import ConfigError
from postrl.records import Response, Task
from postrl.rewards.extract import extract, follows_format, format_term, make_extractor, strip_think


def test_the_docstring_examples_hold():
    assert doctest.testmod(extract_module).failed == 0


@pytest.mark.parametrize("reply, want", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("nested \\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),
    # two different boxed answers are no answer: a hedge over candidates (the hack library's
    # several_answers) cannot be told from a correction
    ("first \\boxed{3}, then corrected: \\boxed{4}", None),
    ("\\boxed{4}, that is \\boxed{ 4 }", "4"),  # the same answer twice is that answer
    ("unclosed \\boxed{3", None),
    ("no box at all: 3", None),
])
def test_boxed(reply, want):
    assert extract("boxed", reply) == want


def test_an_answer_inside_think_only_is_no_answer():
    reply = "<think>it is \\boxed{7} or #### 7 or <answer>7</answer></think>I will not say."
    for spec in ("boxed", "hash", "tag:answer", "last_number"):
        assert extract(spec, reply) is None, spec
    assert extract("boxed", "<think>maybe \\boxed{6}</think> so \\boxed{7}") == "7"
    assert strip_think("<think>unclosed reasoning 5") == ""  # an unclosed think hides the rest


def test_hash_tag_last_number():
    assert extract("hash", "Natalia sold 48/2 = 24 clips.\n#### 1,072") == "1072"
    assert extract("hash", "#### ") is None
    # several different answers in the form are none (a hedge); the same one twice is that one
    assert extract("tag:final", "<final>a</final> <final> b </final>") is None
    assert extract("tag:final", "<final>b</final> <final> b </final>") == "b"
    assert extract("hash", "#### 3\n#### 4") is None and extract("hash", "#### 4\n#### 4") == "4"
    assert extract("tag:final", "<answer>x</answer>") is None
    assert extract("last_number", "from -3.5 to 1,250 and 7/8") == "7/8"
    assert extract("last_number", "no digits") is None


def test_code_fence_takes_the_last_block_or_the_whole_reply():
    reply = "First try:\n```python\ndef f(x):\n    return 0\n```\nFixed:\n```python\ndef f(x):\n    return x\n```\n"
    assert extract("code_fence", reply) == "def f(x):\n    return x\n"
    assert extract("code_fence", "def f(x):\n    return x") == "def f(x):\n    return x"
    assert extract("code_fence", "```\nprint(1)\n```") == "print(1)\n"


def test_none_is_the_whole_reply_without_think():
    assert extract("none", "<think>x</think>  Paris \n") == "Paris"


@pytest.mark.parametrize("spec", ["bogus", "tag:", "tag:1bad", "boxed:x"])
def test_a_bad_extractor_name_is_a_config_error(spec):
    with pytest.raises(ConfigError, match="config key 'k'"):
        make_extractor(spec, "k")


def test_format_term_pays_for_the_domains_format():
    def task(spec):
        return Task("d", "t", "p", "1", meta={"extract": spec})

    tasks = [task("boxed"), task("boxed"), task("code_fence"), task("code_fence"), Task("arith", "t", "p", "1")]
    replies = ["\\boxed{1}", "1", "```\nx=1\n```", "x=1", "\\boxed{2}"]
    assert format_term(tasks, [Response(r, "stop") for r in replies]) == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert follows_format("tag:answer", "<answer> </answer>") is False
