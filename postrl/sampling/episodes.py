"""Multi-turn rollouts: the policy plays episodes against environments, token in, token out.

    samples = sample_episodes(policy, tasks, n, envs, limits, params, generator, temperatures, on_ready)

Each episode starts from its environment's opening messages (through the chat template, as any
prompt), then alternates: the model samples a turn through the policy's sampling backend (ending
at EOS, a stop string, or a tool call's closing tag), the environment's `step` answers it. The
tokens trained on are the tokens sampled: a turn's ids are appended verbatim and the
observation's tokens after them, tokenised as the chat template's delta for the new turn (the
rendering after the assistant turn's content: its closing, the observation turns, the next
assistant header; without a chat template, the observation's text), so the transcript is never
re-tokenised. Observation tokens carry log-prob 0 and loss mask 0 (`Sample.loss_mask`): out of
the loss and the KL.

Limits, and the episode's recorded end reason: the environment ends it (`done`); `max_turns`
assistant turns (`max_turns`); the token budget, prompt plus every turn and observation
(`context`: a turn is sampled with at most the tokens left, and an observation that does not fit
ends the episode); a turn that hits max_new_tokens (`length`). Before episodes open, an
environment with `use_chat_template` is handed the tokenizer's chat template (a tool environment
reads calls in the format it asks for).

Draws: every round samples the live episodes in a fixed order (by temperature, turn limit and
stop strings, then row order) from the one generator, so an order's episodes are a function of
(weights, seed, step, stream) like single-turn samples, and a resumed run replays them exactly.
Each round re-reads the whole context (no KV cache kept across turns): simple and exact.
This module knows no environment's internals (it calls `reset` and `step`) and no tool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from postrl.abilities import Judged, OffersTools, Resettable
from postrl.records import Episode, Sample, Task, Turn
from postrl.sampling.generate import Generation, GenParams
from postrl.sampling.policy import Policy

_PLACE = "\x1fpostrl-turn\x1f"


@dataclass(frozen=True)
class EpisodeLimits:
    max_new_tokens: int
    """Longest assistant turn."""
    stop: tuple[str, ...] = ()
    """The domain's stop strings: end a turn, and are cut from the text the environment sees."""
    max_tokens: int = 0
    """Budget of prompt + all turns (0: the model's context length)."""


class _SingleTurn:
    """A single-turn domain's episode (the trivial environment): the first answer ends it."""

    max_turns = 1

    def __init__(self, task: Task):
        self.messages = list(task.messages) if task.messages else [{"role": "user", "content": task.prompt}]

    def step(self, assistant_text: str):
        return None, None, True


@dataclass
class _Row:
    group: int
    task: Task
    episode: Any
    max_turns: int
    stop: tuple[str, ...]
    """The environment's stop strings (a tool call's closing tag): kept in the text it sees."""
    limits: EpisodeLimits
    temperature: float
    prompt_ids: list[int]
    history: list[dict]
    tools: list[dict]
    """The tools' JSON schemas given to a chat template that renders them (empty: none, or the
    template does not: the episode's own messages describe them)."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    record: Episode = field(default_factory=Episode)
    finish_reason: str = "stop"
    sample_s: float = 0.0
    sync_s: float = 0.0
    done: bool = False
    sample: Sample | None = None
    """Made once, when the episode ends: the object handed to `on_ready` is the one returned."""

    def length(self) -> int:
        return len(self.prompt_ids) + len(self.ids)


@torch.no_grad()
def sample_episodes(
    policy: Policy, tasks: list[Task], n: int, envs: dict[str, Any], limits: Callable[[Task], EpisodeLimits],
    params: GenParams, generator: torch.Generator | None = None, temperatures: list[float] | None = None,
    on_ready: Callable[[list[Sample]], None] | None = None,
) -> list[Sample]:
    """n episodes per task, grouped as `Policy.sample` groups samples ([i*n : (i+1)*n] are task i's).
    `envs[task.domain]` opens each task's episodes (`reset`); a domain without `reset` plays the
    trivial single-turn episode. `on_ready` gets each set of whole groups as their last episode ends."""
    was_training = policy.model.training
    policy.model.eval()
    for env in envs.values():  # an environment whose turns depend on the template (tool_format: auto) learns it
        if callable(getattr(env, "use_chat_template", None)):
            env.use_chat_template(getattr(policy.tok, "chat_template", None))
    temps = temperatures or [params.temperature] * (len(tasks) * n)
    rows = [_open_row(policy, g, task, envs.get(task.domain), limits(task), temps[g * n + j])
            for g, task in enumerate(tasks) for j in range(n)]
    reported = [False] * len(tasks)
    while any(not r.done for r in rows):
        for key, idx in _rounds(rows, params).items():
            for start in range(0, len(idx), policy.max_batch):
                _sample_turn(policy, [rows[i] for i in idx[start : start + policy.max_batch]], key, params, generator)
        _report(rows, n, reported, policy, on_ready)
    policy.model.train(was_training)
    return [_to_sample(r, policy) for r in rows]


def _open_row(policy: Policy, g: int, task: Task, env, limits: EpisodeLimits, temperature: float) -> _Row:
    episode = env.reset(task) if isinstance(env, Resettable) else _SingleTurn(task)
    tools = list(episode.tool_schemas) if policy.renders_tools() and isinstance(episode, OffersTools) else []
    messages = [dict(m) for m in (episode.template_messages if tools else episode.messages)]
    prompt_ids = policy.encode_task(replace(task, messages=tuple(messages)), tools=tools)
    budget = limits.max_tokens or getattr(policy.model.config, "max_position_embeddings", 0) or 1 << 30
    return _Row(g, task, episode, getattr(env, "max_turns", 1) if env is not None else 1, tuple(getattr(env, "stop", ())),
                replace(limits, max_tokens=budget), temperature, prompt_ids, messages, tools)


def _rounds(rows: list[_Row], params: GenParams) -> dict[tuple, list[int]]:
    """Live rows by (temperature, max new tokens, stop strings), in a fixed order; a row with no
    room left ends here (`context`)."""
    keyed: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if r.done:
            continue
        left = r.limits.max_tokens - r.length()
        if left < 1:
            _end(r, "context")
            continue
        key = (r.temperature, min(r.limits.max_new_tokens, left), r.limits.stop + r.stop)
        keyed.setdefault(key, []).append(i)
    return dict(sorted(keyed.items()))


def _sample_turn(policy: Policy, rows: list[_Row], key: tuple, params: GenParams, generator) -> None:
    temperature, max_new, stops = key
    t0 = time.perf_counter()
    gens = policy.generate([r.prompt_ids + r.ids for r in rows],
                           replace(params, temperature=temperature, max_new_tokens=max_new, stop_strings=stops),
                           generator)
    share, sync = (time.perf_counter() - t0) / len(rows), policy.take_sync_s() / len(rows)
    for r, gen in zip(rows, gens):
        r.sample_s += share
        r.sync_s += sync
        _take_turn(policy, r, gen, share)


def _take_turn(policy: Policy, r: _Row, gen: Generation, sample_s: float) -> None:
    """Append a sampled turn verbatim, hand its text to the environment, append its observation."""
    r.ids += gen.token_ids
    r.logprobs += gen.logprobs
    r.mask += [1] * len(gen.token_ids)
    text = policy.decode(gen.token_ids)
    for stop in r.limits.stop:  # the domain's own stops are cut; a tool call's closing tag is kept
        text = text.split(stop, 1)[0]
    turn = Turn("assistant", text, len(gen.token_ids), seconds=sample_s)
    r.record.turns.append(turn)
    r.record.final_text, r.finish_reason = text, gen.finish_reason
    if gen.finish_reason == "length":
        return _end(r, "length")
    t0 = time.perf_counter()
    observation, reward, done = r.episode.step(text)
    step_s = time.perf_counter() - t0
    if done:
        r.record.reward = reward
        judged = reward is not None and isinstance(r.episode, Judged)
        r.record.correct, r.record.components = (r.episode.correct, dict(r.episode.components)) if judged else (None, {})
        return _end(r, "done")
    r.history.append({"role": "assistant", "content": text})
    observation = observation or []
    turn.tool = next((m.get("tool", "") for m in observation if m.get("tool")), "")
    if sum(t.role == "assistant" for t in r.record.turns) >= r.max_turns:
        return _end(r, "max_turns")
    delta = observation_ids(policy, r.history, observation, ended_with_eos=gen.token_ids[-1:] == [policy.tok.eos_token_id],
                            tools=r.tools)
    fits = r.length() + len(delta) < r.limits.max_tokens
    for m in observation:
        r.record.turns.append(Turn(m["role"], m["content"], 0, m.get("tool", ""), m.get("status", ""),
                                   step_s / len(observation)))
    if not fits:
        return _end(r, "context")
    r.record.turns[-1].tokens = len(delta)  # the delta (template framing included) counted on the last
    r.history += [{"role": m["role"], "content": m["content"]} for m in observation]
    r.ids += delta
    r.logprobs += [0.0] * len(delta)
    r.mask += [0] * len(delta)


def observation_ids(policy: Policy, history: list[dict], observation: list[dict], ended_with_eos: bool,
                    tools: list[dict] = ()) -> list[int]:
    """The tokens of an observation after an assistant turn: the chat template's rendering from the
    end of that turn's content (its closing, the observation turns, the next assistant header),
    less the EOS the model already sampled; without a template, the observation's text."""
    tok = policy.tok
    if not getattr(tok, "chat_template", None):
        return tok("".join(m["content"] for m in observation), add_special_tokens=False)["input_ids"]
    plain = [{"role": m["role"], "content": m["content"]} for m in history[:-1]]
    plain += [{"role": "assistant", "content": _PLACE}] + [{"role": m["role"], "content": m["content"]}
                                                          for m in observation]
    extra = {"tools": list(tools)} if tools else {}
    rendered = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **extra)
    delta = rendered[rendered.rindex(_PLACE) + len(_PLACE) :]
    if ended_with_eos and tok.eos_token and delta.startswith(tok.eos_token):
        delta = delta[len(tok.eos_token) :]
    return tok(delta, add_special_tokens=False)["input_ids"]


def _end(r: _Row, reason: str) -> None:
    r.done, r.record.end_reason = True, reason


def _report(rows: list[_Row], n: int, reported: list[bool], policy: Policy, on_ready) -> None:
    ready = [g for g in range(len(reported)) if not reported[g] and all(r.done for r in rows[g * n : (g + 1) * n])]
    for g in ready:
        reported[g] = True
    if ready and on_ready is not None:
        on_ready([_to_sample(rows[g * n + j], policy) for g in ready for j in range(n)])


def _to_sample(r: _Row, policy: Policy) -> Sample:
    if r.sample is None:
        r.sample = Sample(
            task=r.task, group=r.group, prompt_ids=r.prompt_ids, completion_ids=r.ids, logprobs=r.logprobs,
            text=r.record.final_text, finish_reason=r.finish_reason, temperature=r.temperature,
            policy_version=policy.version, timings={"sample_s": r.sample_s, "sync_s": r.sync_s}, loss_mask=r.mask, episode=r.record,
        )
    return r.sample
