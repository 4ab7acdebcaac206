"""Typed records passed between the stages of the loop. A leaf: imports nothing from postrl.

    Task  --policy.sample-->  Sample (one completion, with its Response)  --reward-->  Sample.score
    Group = the samples of one prompt; advantages are relative within a group.
    Batch = the tensors the update consumes, built from a step's samples.

A `Score` separates "wrong" (correct=False, status "ok") from "could not verify" (correct=None,
status "timeout", "error", or "not_applicable" where every reward function said None): the trainer
never turns the latter into a silent zero without it being counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only Batch's annotations name it: `import postrl` and `postrl --help` stay without torch
    import torch


@dataclass(frozen=True)
class Task:
    domain: str
    """Registry name of the domain that made it."""
    task_id: str
    """Stable id: the same problem always has the same id."""
    prompt: str
    """Text given to the model (before any chat template)."""
    answer: str
    """Gold answer as text (for code: the entry point; tests live in `meta`)."""
    level: int = 0
    """Difficulty level within the domain."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Domain-specific data the grader needs (tests, reasoning-gym entry, ...)."""
    messages: tuple[dict[str, str], ...] | None = field(default=None, compare=False, hash=False)
    """Chat messages (system and user turns) for a chat model, when the domain provides them;
    None: `prompt` is the one user message. The policy renders them with the model's chat template."""


@dataclass(frozen=True)
class Response:
    text: str
    """Decoded completion without the EOS token."""
    finish_reason: str
    """'stop' (EOS or a stop string) or 'length' (hit max_new_tokens)."""



STATUSES = ("ok", "timeout", "error", "not_applicable")
NOT_APPLICABLE = "not_applicable"
"""A reward function's None (TRL's "does not apply to this sample"): left out of the reward's sum;
a sample no term applies to is unverified (zero advantage)."""


@dataclass
class Score:
    reward: float
    """Scalar reward used for the advantage."""
    correct: bool | None
    """Verifier verdict; None when the verifier could not decide."""
    status: str = "ok"
    """ok | timeout | error | not_applicable: whether the verifier itself ran to completion."""
    components: dict[str, float] = field(default_factory=dict)
    """Named reward terms that make up `reward` (logged separately)."""
    detail: str = ""
    """Short human-readable note (e.g. an error message), for spot checks."""
    extracted: str | None = None
    """The answer the verifier graded, as extracted from the response (None: no extraction step)."""
    logged: dict[str, Any] = field(default_factory=dict)
    """Columns a reward function logged for this sample (TRL's `log_extra`), stored with it."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Values this sample adds to the step's metrics, each averaged over the samples that carry it:
    a reward function's value where it applied, and what it logged with TRL's `log_metric`."""


@dataclass
class Turn:
    """One turn of an episode, as stored in the rollout store and shown in spot checks."""

    role: str
    """assistant (sampled by the model) | tool (a tool's result) | user (feedback from the environment)."""
    text: str
    tokens: int
    """Token count of this turn in the sample's tokens (0 when it ended the episode unsent)."""
    tool: str = ""
    """The tool called (assistant turn with a call) or answering (tool turn); empty otherwise."""
    status: str = ""
    """Tool turns: ok | error | timeout | malformed | unknown_tool | output_limit; empty otherwise."""
    seconds: float = 0.0
    """Wall time of the turn: sampling it (assistant) or running the tool / environment step."""


@dataclass
class Episode:
    """A multi-turn rollout: its turns, why it ended, and the environment's verdict if it gave one."""

    turns: list[Turn] = field(default_factory=list)
    end_reason: str = ""
    """done (the environment ended it) | max_turns | context (the token budget ran out) | length
    (the last turn hit max_new_tokens)."""
    reward: float | None = None
    """The environment's reward at the end (None: the domain grades the final answer)."""
    components: dict[str, float] = field(default_factory=dict)
    """Named parts of `reward` the environment reports (e.g. the per-turn cost)."""
    correct: bool | None = None
    """The environment's verdict, when it gives one with its reward."""
    final_text: str = ""
    """The last assistant turn's text: what the domain grades when the environment gives no reward."""

    @property
    def tool_calls(self) -> int:
        return sum(1 for t in self.turns if t.role == "tool")

    @property
    def tool_errors(self) -> int:
        return sum(1 for t in self.turns if t.role == "tool" and t.status != "ok")


@dataclass
class Sample:
    """One completion. Who fills what: the policy's sampler makes it (every field down to
    `policy_version`, and `timings["sample_s"]`); the engine that ran it attaches `score` and
    `timings["reward_s"]` (`postrl.engines.orders.Pending.result`); the learner sets
    `advantage` and `kl_penalty` when it builds the step's batch (`Learner.build_batch`). Dynamic
    sampling renumbers `group` on copies (`dataclasses.replace`), never on the sampler's objects."""

    task: Task
    group: int
    """Index of this sample's group (prompt) within the step."""
    prompt_ids: list[int]
    """Prompt token ids as fed to the model (after any chat template), no padding."""
    completion_ids: list[int]
    """Sampled token ids, including the EOS token when the model emitted one."""
    logprobs: list[float]
    """Behaviour log-probabilities of `completion_ids` under the sampling policy (at `temperature`)."""
    text: str
    """Decoded completion, without EOS."""
    finish_reason: str
    """'stop' or 'length'."""
    temperature: float
    policy_version: int
    """Number of optimiser updates the sampling policy had received."""
    score: Score | None = None
    advantage: float = 0.0
    """The advantage this sample was trained with: its group-relative one, or with a critic
    (`rl.advantage: gae`) the mean of its per-token advantages."""
    kl_penalty: float | None = None
    """With `rl.kl_in: reward`, the KL penalty subtracted from the reward before the advantage
    (stored as the reward component `kl_penalty`, negative); None otherwise."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent on this sample's stages, e.g. {'sample_s': .., 'reward_s': ..} (per-batch share)."""
    loss_mask: list[int] | None = None
    """Multi-turn episodes: 1 where `completion_ids[j]` was sampled by the model, 0 where it is an
    observation's token (a tool result, feedback), excluded from the loss and the KL; None = every
    completion token was sampled (single turn). Filled by the episode runner with the tokens."""
    episode: Episode | None = None
    """The turns of a multi-turn episode (None: a single-turn sample). Filled by the episode runner
    (`postrl.sampling.episodes`), which makes the sample."""
    ref_logprobs: list[float] | None = None
    """Reference log-probs of `completion_ids` (0 on observation tokens), when a sampler process
    computed them (`pipeline.reference: sampler`); None = the learner computes them."""

    @property
    def response(self) -> Response:
        return Response(self.text, self.finish_reason)

    @property
    def reward(self) -> float:
        return self.score.reward if self.score is not None else 0.0


@dataclass
class Batch:
    """Right-padded tensors for the update. B = number of completions, T = prompt+completion length.
    Made whole, advantages included, by `Learner.build_batch`; nothing fills it in later."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T-1] float, 1 where position t predicts a completion token
    old_logprobs: torch.Tensor  # [B, T-1] behaviour log-probs, aligned with loss_mask
    ref_logprobs: torch.Tensor | None  # [B, T-1] reference log-probs, None when KL is off
    advantages: torch.Tensor  # [B] one scalar per completion, or [B, T-1] one per token (rl.advantage: gae)
    temperatures: torch.Tensor  # [B] sampling temperature of each completion
    prox_logprobs: torch.Tensor | None = None
    """[B, T-1] log-probs under the trainer's weights when the batch is consumed, for off-policy
    (asynchronous) batches; equal to old_logprobs on rows sampled by those same weights. None =
    every row is on-policy and the loss is plain PPO on the behaviour log-probs. With a rollout
    correction (`rl.rollout_correction`) it holds the trainer's log-probs on every row."""
    fresh: torch.Tensor | None = None
    """[B] bool: rows sampled at the learner's policy version when the batch was built, where the
    learner's log-probs measure the train/inference mismatch; None = not known (no measurement)."""
    values: torch.Tensor | None = None
    """[B, T-1] the critic's values when the batch was built (`critic.model`; None without one):
    the centre of its value clipping."""
    returns: torch.Tensor | None = None
    """[B, T-1] GAE's returns, the critic's targets."""
    value_mask: torch.Tensor | None = None
    """[B, T-1] the tokens the critic learns from: the loss mask of the verified completions."""
