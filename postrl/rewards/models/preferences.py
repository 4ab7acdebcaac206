"""Preference pairs in TRL's format, read from JSONL, and the held-out split by prompt.

    pairs = load_pairs("prefs.jsonl")               # one Pair per line
    train, heldout = split_pairs(pairs, 0.2)        # a prompt falls on one side only

A line is one of TRL's preference forms:

    {"prompt": "2+2=", "chosen": "4", "rejected": "5"}                                  # text
    {"prompt": [{"role": "user", "content": "2+2?"}],
     "chosen": [{"role": "assistant", "content": "4"}], "rejected": [...]}             # chat
    {"chosen": [{"role": "user", ...}, {"role": "assistant", "content": "4"}],
     "rejected": [{"role": "user", ...}, {"role": "assistant", "content": "5"}]}       # implicit prompt

In the implicit form the prompt is the messages the two conversations share from the start, and
each side keeps the rest (TRL's `maybe_extract_prompt`). Text is kept as text and messages as a
tuple of {role, content}; the reward model renders them (`postrl.rewards.models.rm`): text by plain
concatenation as TRL does, messages through the backbone's chat template.

    >>> p = pair_of_row({"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    ...                  "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go"}]})
    >>> p.prompt, p.chosen
    (({'role': 'user', 'content': 'hi'},), ({'role': 'assistant', 'content': 'hello'},))
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from postrl.rewards.jsonl import read_jsonl

Messages = tuple[dict[str, str], ...]
Text = str | Messages
"""A prompt or a reply: plain text, or chat messages."""


@dataclass(frozen=True)
class Pair:
    prompt: Text
    chosen: Text
    rejected: Text


def _messages(value, field: str) -> Messages:
    if not isinstance(value, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        raise ValueError(f"field '{field}': expected text or a list of {{role, content}} messages")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def _text(value, field: str) -> Text:
    return value if isinstance(value, str) else _messages(value, field)


def pair_of_row(row: dict) -> Pair:
    """The Pair of one JSONL object; ValueError saying what is wrong."""
    chosen, rejected = _text(row["chosen"], "chosen"), _text(row["rejected"], "rejected")
    if "prompt" in row:
        return Pair(_text(row["prompt"], "prompt"), chosen, rejected)
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise ValueError("chosen and rejected must both be text or both be messages")
    if isinstance(chosen, str):
        return Pair("", chosen, rejected)
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise ValueError("no prompt: give a `prompt` field, or conversations that start with the same messages")
    return Pair(chosen[:shared], chosen[shared:], rejected[shared:])


def load_pairs(path: str | Path) -> list[Pair]:
    """Every line's Pair; a malformed line raises UserError('FILE:LINE: ...')."""
    pairs: list[Pair] = []

    def check(row: dict) -> str | None:
        try:
            pairs.append(pair_of_row(row))
        except ValueError as e:
            return str(e)
        return None

    read_jsonl(path, {"chosen": (str, list), "rejected": (str, list)}, check=check)
    return pairs


def prompt_key(prompt: Text) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def split_pairs(pairs: list[Pair], heldout_fraction: float) -> tuple[list[Pair], list[Pair]]:
    """(train, heldout), split by a hash of the prompt so that a prompt is on one side only."""
    def bucket(p: Pair) -> float:
        return int(hashlib.sha256(prompt_key(p.prompt).encode()).hexdigest()[:8], 16) / 16**8

    train = [p for p in pairs if bucket(p) >= heldout_fraction]
    heldout = [p for p in pairs if bucket(p) < heldout_fraction]
    return train, heldout
