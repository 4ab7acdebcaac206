"""Shared test helpers."""

from __future__ import annotations

import pytest

from postrl.records import Sample, Score, Task


def build_sample(
    text: str = "42",
    *,
    domain: str = "arith",
    task_id: str = "t0",
    group: int = 0,
    reward: float | None = 1.0,
    correct: bool | None = True,
    components: dict[str, float] | None = None,
    status: str = "ok",
    completion_ids: list[int] | None = None,
    finish_reason: str = "stop",
    temperature: float = 1.0,
    policy_version: int = 0,
    advantage: float = 0.0,
) -> Sample:
    """A synthetic `Sample`; `reward=None` leaves it unscored. Token ids default to one per character."""
    ids = completion_ids if completion_ids is not None else [ord(c) % 97 for c in text]
    score = None
    if reward is not None:
        score = Score(reward=reward, correct=correct, status=status, components=components or {"correct": reward})
    return Sample(
        task=Task(domain, task_id, f"prompt of {task_id}", "42", level=1),
        group=group,
        prompt_ids=[1, 2, 3],
        completion_ids=ids,
        logprobs=[-0.5] * len(ids),
        text=text,
        finish_reason=finish_reason,
        temperature=temperature,
        policy_version=policy_version,
        score=score,
        advantage=advantage,
        timings={"sample_s": 0.25, "reward_s": 0.125},
    )


@pytest.fixture
def make_sample():
    """Factory fixture: `make_sample(text, reward=..., correct=..., components=...)` -> `Sample`."""
    return build_sample


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A very small HF model directory from `postrl pretrain` (seconds, not minutes)."""
    from postrl.pretrain import PretrainSpec, pretrain

    spec = PretrainSpec(steps=30, batch_size=32, hidden_size=32, layers=2, heads=2)
    return pretrain(spec, tmp_path_factory.mktemp("models") / "tiny", log=lambda *a: None)
