"""Environments: multi-turn domains. An environment is a domain that also opens episodes:

    episode = env.reset(task)            # one per rollout; episode.messages opens it
    observation, reward, done = episode.step(assistant_text)
        # observation: messages for the next turn ({role, content}; a tool turn also carries
        #   `tool` and `status`) or None; reward: the environment's verdict at the end, or None
        #   when the domain grades the final answer (`score`); done: the episode is over
    episode.tool_schemas                 # optional: its tools as JSON schemas, and the opening
    episode.template_messages            #   messages without their description, for a chat
                                         #   template that renders tools itself
    env.max_turns                        # most assistant turns in an episode
    env.stop                             # strings that end an assistant turn (a tool call's closing tag)
    env.use_chat_template(template)      # optional: told the model's chat template before episodes open
    env.score_episodes(tasks, responses, episodes)   # one Score per finished episode

Any domain becomes one by `tools:` or `max_turns:` in its recipe entry (`ToolEnv` wraps it); a
domain registered as an environment type (`type: code_retry`) is one already, and may be wrapped
too for tools. Its calls are read in its `tool_format` (`postrl.tools.formats`); `auto` follows
the chat template the episode runner hands `use_chat_template` (hermes until then, and for a
model without one). A single-turn domain is the trivial environment: its episode ends at the first
answer. Turn limits and the token budget are the episode runner's
(`postrl.sampling.episodes`), which knows no environment's internals; this module knows no policy.
"""

from __future__ import annotations

from typing import Any, Protocol

from postrl.abilities import Closeable, DeclaresComponents, Judged, Resettable
from postrl.config.schema import Config, DomainConfig
from postrl.records import Episode as EpisodeRecord
from postrl.records import Response, Score, Task
from postrl.rewards.sandbox_handle import SandboxHandle
from postrl.sandbox.settings import SandboxSettings
from postrl.tasks.base import DOMAINS
from postrl.tools import builtin  # noqa: F401  (registers calculator and python)
from postrl.tools.base import (
    RESULT_CLOSE,
    RESULT_OPEN,
    ToolContext,
    ToolResult,
    make_tools,
    run_call,
    tool_schemas,
)
from postrl.tools.formats import AUTO, ToolFormat, resolve_format

Messages = list[dict[str, Any]]
DEFAULT_TOOL_TURNS = 4
MAX_CALLS_PER_TURN = 8
"""Calls of one turn that are run (formats with several calls a turn); the rest get one `malformed` observation."""


class Episode(Protocol):
    messages: Messages
    """The opening messages (system and user turns)."""

    def step(self, assistant_text: str) -> tuple[Messages | None, float | None, bool]: ...


class Environment(Protocol):
    name: str
    max_turns: int
    stop: tuple[str, ...]

    def reset(self, task: Task) -> Episode: ...

    def score_episodes(self, tasks: list[Task], responses: list[Response],
                       episodes: list[EpisodeRecord | None]) -> list[Score]: ...


def is_environment(domain: Any) -> bool:
    """Whether a domain (or a domain type's factory) opens episodes: `postrl.abilities.Resettable`."""
    return isinstance(domain, Resettable)


def has_environments(cfg: Config) -> bool:
    """Whether a recipe's domains include an environment (tools, a turn limit, or an environment type),
    without building them."""
    return any(d.tools or d.max_turns or is_environment(DOMAINS.get(d.type or name))
               for name, d in cfg.domains.items() if (d.type or name) in DOMAINS)


def opening_messages(task: Task) -> Messages:
    return [dict(m) for m in task.messages] if task.messages else [{"role": "user", "content": task.prompt}]


def score_by_episode(domain: Any, tasks: list[Task], responses: list[Response],
                     episodes: list[EpisodeRecord | None]) -> list[Score]:
    """The environment's own verdict where an episode ended with one; the domain's grading of the
    final answer (`domain.score`, in one batched call) for the others."""
    out: list[Score | None] = [None] * len(tasks)
    rest = []
    for i, ep in enumerate(episodes):
        if ep is not None and ep.reward is not None:
            out[i] = Score(ep.reward, ep.correct, "ok", dict(ep.components), detail=f"episode: {ep.end_reason}")
        else:
            rest.append(i)
    if rest:
        for i, score in zip(rest, domain.score([tasks[i] for i in rest], [responses[i] for i in rest])):
            out[i] = score
    return out


class ToolEpisode:
    """An episode in which tool calls are answered here; any other turn goes to the inner episode
    (or, for a single-turn domain, ends the episode: the domain grades it)."""

    def __init__(self, inner: Episode | None, messages: Messages, tools: dict, ctx: ToolContext, fmt: ToolFormat):
        self.inner, self.messages, self.tools, self.ctx, self.format = inner, messages, tools, ctx, fmt
        self.template_messages: Messages = messages
        """The opening messages without the tools' description, for a template given `tool_schemas`."""
        self.tool_schemas: list[dict] = []
        """The tools as JSON schemas (empty: no tools); see `postrl.sampling.episodes`."""

    @property
    def correct(self) -> bool | None:
        """The inner episode's verdict, when it gave a reward (e.g. code_retry's)."""
        return self.inner.correct if isinstance(self.inner, Judged) else None

    @property
    def components(self) -> dict[str, float]:
        return dict(self.inner.components) if isinstance(self.inner, Judged) else {}

    def step(self, assistant_text: str) -> tuple[Messages | None, float | None, bool]:
        calls = self.format.parse(assistant_text) if self.tools else []
        if not calls:
            return self.inner.step(assistant_text) if self.inner is not None else (None, None, True)
        observation = [tool_message(getattr(call, "name", ""), run_call(call, self.tools, self.ctx))
                       for call in calls[:MAX_CALLS_PER_TURN]]
        if len(calls) > MAX_CALLS_PER_TURN:
            observation.append(tool_message("", ToolResult(f"{len(calls) - MAX_CALLS_PER_TURN} more calls not run "
                                                           f"(at most {MAX_CALLS_PER_TURN} a turn)", "malformed")))
        return observation, None, False


def tool_message(name: str, result: ToolResult) -> dict[str, Any]:
    """A call's result as the observation turn the model reads, with the tool and status recorded."""
    return {"role": "tool", "content": f"{RESULT_OPEN}{result.text}{RESULT_CLOSE}", "tool": name, "status": result.status}


class ToolEnv:
    """`domain` as an environment: with `tools`, calls in its turns are run and answered; with
    `max_turns`, its episodes' turn limit. Everything else is the domain's (delegated)."""

    def __init__(self, domain: Any, dcfg: DomainConfig, name: str):
        self.domain, self.name = domain, name
        self.tools = make_tools(list(dcfg.tools), key=f"domains.{name}.tools")
        self.sandbox = SandboxHandle(SandboxSettings(workers=1), f"domain {name} (python tool)", "") \
            if "python" in self.tools else None
        self.ctx = ToolContext(dcfg.tool_timeout_s, dcfg.tool_output_chars, self.sandbox)
        inner_turns = getattr(domain, "max_turns", 1) if is_environment(domain) else 1
        self.max_turns = dcfg.max_turns or (inner_turns + DEFAULT_TOOL_TURNS - 1 if self.tools else inner_turns)
        self.inner_stop = tuple(getattr(domain, "stop", ()))
        self.format_setting = dcfg.tool_format
        """`domains.NAME.tool_format`: a format's name, or auto (resolved by `use_chat_template`)."""
        self.format = resolve_format(dcfg.tool_format, None, key=f"domains.{name}.tool_format")
        self.reward_components = domain.reward_components if isinstance(domain, DeclaresComponents) else ()

    def __getattr__(self, attr: str) -> Any:  # levels, sample, heldout, state_dict, sandbox_config, ...
        if attr == "domain":  # not set yet (unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.domain, attr)

    @property
    def stop(self) -> tuple[str, ...]:
        """The inner domain's stop strings, and the format's (a call's closing tag) when there are tools."""
        return self.inner_stop + (self.format.stop if self.tools else ())

    def use_chat_template(self, chat_template: str | dict | None) -> None:
        """The model's chat template (the episode runner's tokenizer's): under `tool_format: auto`,
        calls are read in the format it asks for."""
        if self.format_setting == AUTO:
            self.format = resolve_format(AUTO, chat_template)

    def reset(self, task: Task) -> ToolEpisode:
        inner = self.domain.reset(task) if is_environment(self.domain) else None
        opening = [dict(m) for m in inner.messages] if inner is not None else opening_messages(task)
        episode = ToolEpisode(inner, with_system(opening, self.format.describe(self.tools)) if self.tools else opening,
                              self.tools, self.ctx, self.format)
        if self.tools:  # for a chat template that renders tools itself, from their schemas
            episode.template_messages, episode.tool_schemas = opening, tool_schemas(self.tools)
        return episode

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return self.domain.score(tasks, responses)

    def score_episodes(self, tasks: list[Task], responses: list[Response],
                       episodes: list[EpisodeRecord | None]) -> list[Score]:
        if is_environment(self.domain):
            return self.domain.score_episodes(tasks, responses, episodes)
        return score_by_episode(self.domain, tasks, responses, episodes)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if isinstance(self.domain, Closeable):
            self.domain.close()


def with_system(messages: Messages, text: str) -> Messages:
    """`text` as the system turn: appended to the first one, or a new one before the rest."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def as_environment(domain: Any, dcfg: DomainConfig, name: str) -> Any:
    """The domain as the recipe entry makes it: wrapped when it asks for tools or a turn limit."""
    if dcfg.tools or dcfg.max_turns:
        return ToolEnv(domain, dcfg, name)
    return domain
