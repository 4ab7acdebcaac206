"""The policy: a causal LM plus its tokenizer, turning `Task`s into sampled `Sample`s through a
sampling backend (`postrl.sampling.backends`, chosen by `rollout.backend`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import astuple, replace

import torch

from postrl.abilities import Closeable
from postrl.config.schema import RolloutConfig
from postrl.records import Sample, Task
from postrl.sampling.backends import SAMPLING_BACKENDS, SamplingBackend, backend_factory, make_backend
from postrl.sampling.generate import Generation, GenParams


class Policy:
    def __init__(self, model, tokenizer, max_batch: int | None = None, rollout: RolloutConfig | None = None):
        self.model = model
        self.tok = tokenizer
        rollout = rollout or RolloutConfig()
        self.version = 0
        """Optimiser updates applied so far; stamped on every sample."""
        self.rollout = replace(rollout, max_num_seqs=max_batch or rollout.max_num_seqs)
        """The sampling backend's settings (`rollout`; `rollout.backend` names it), `max_batch` (when
        given) as its `max_num_seqs`: the slots of a backend that batches continuously."""
        backend_factory(self.rollout.backend)  # an unknown name fails here, not at the first sample
        self._backend: SamplingBackend | None = None
        self._synced: int | None = None
        """The version the backend last loaded; None: it loads before the next sampling call."""
        self._sync_s = 0.0
        """Seconds the backend spent loading weights since `take_sync_s` last read them."""

    @property
    def max_batch(self) -> int:
        """Largest number of sequences generated at once (bounds KV-cache memory): `rollout.max_num_seqs`."""
        return self.rollout.max_num_seqs

    @property
    def backend(self) -> SamplingBackend:
        """Built on first use: a process that never samples (a learner rank) never starts one."""
        if self._backend is None:
            self._backend = make_backend(self.rollout, self.model, self.tok)
        return self._backend

    def close(self) -> None:
        """Stop the backend, when it holds more than the model (vLLM's engine, its process group);
        the next sampling call builds it again."""
        if isinstance(self._backend, Closeable):
            self._backend.close()
        self._backend, self._synced = None, None

    def load_weights(self, state: dict | None, version: int) -> None:
        """New weights to sample with: `state` copied into the model (None: the model holds them
        already, written in place by a restore), stamped `version`. The backend loads them before
        the next sampling call, even under a version number it has loaded before."""
        if state is not None:
            self.model.load_state_dict(state)
        self.version = version
        self._synced = None

    def generate(self, prompts: list[list[int]], params: GenParams | list[GenParams],
                 generator: torch.Generator | None = None,
                 on_done: Callable[[list[int], list[Generation]], None] | None = None) -> list[Generation]:
        """Token ids in, `Generation`s out, through the backend, with the weights of `version`:
        the backend's `load_weights` runs once per version, here, before its first sampling call.
        `params`: one for all prompts or one per prompt; a backend without `row_params` is called
        once per distinct GenParams, in order of first appearance."""
        if self._synced != self.version:
            backend = self.backend  # built on first use, outside the timed sync
            t0 = time.perf_counter()
            backend.load_weights(self.version)
            self._sync_s += time.perf_counter() - t0
            self._synced = self.version
        if not isinstance(params, list) or SAMPLING_BACKENDS.facts(self.rollout.backend).row_params:
            return self.backend.generate(prompts, params, generator, on_done)
        parts: dict[tuple, tuple[GenParams, list[int]]] = {}
        for i, p in enumerate(params):
            parts.setdefault(astuple(p), (p, []))[1].append(i)
        out: list[Generation | None] = [None] * len(prompts)
        for p, idx in parts.values():
            done = None if on_done is None else (lambda rows, gens, idx=idx: on_done([idx[r] for r in rows], gens))
            for i, gen in zip(idx, self.backend.generate([prompts[i] for i in idx], p, generator, done)):
                out[i] = gen
        return out

    def take_sync_s(self) -> float:
        """Seconds spent syncing weights into the backend since the last call (then zero again): the
        callers of `generate` share them out over the samples they make (`timings["sync_s"]`)."""
        seconds, self._sync_s = self._sync_s, 0.0
        return seconds

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode_task(Task("", "", text, ""))

    def encode_task(self, task: Task, tools: list[dict] | None = None) -> list[int]:
        """The prompt's token ids (`prompt_ids` with this policy's tokenizer)."""
        return prompt_ids(self.tok, task, tools)

    def renders_tools(self) -> bool:
        """Whether the chat template describes tools itself from `tools=` (Qwen2.5, Hermes), rather
        than being left to a system message."""
        return "tools" in (getattr(self.tok, "chat_template", None) or "")

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @torch.no_grad()
    def sample(
        self,
        tasks: list[Task],
        n: int,
        params: GenParams | list[GenParams],
        generator: torch.Generator | None = None,
        temperatures: list[float] | None = None,
        on_ready: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        """n completions per task, grouped: samples [i*n : (i+1)*n] belong to tasks[i] (group i).

        `params`: one GenParams for every task, or a list of one per task (greedy and sampled
        tasks, other lengths and stop strings, generated together in one batch).
        `temperatures` (one per sample, with one GenParams) overrides params.temperature; samples
        that share a temperature are generated together, in a fixed order, so the draws stay deterministic.
        `on_ready(samples)` is called, while generation goes on, with each set of whole groups
        whose last sample has just finished (in group order), so they can be graded meanwhile.
        Their `timings["sample_s"]` (and `["sync_s"]`, the weight sync's share, included in it) are
        filled in when their generation chunk ends."""
        if isinstance(params, list) and (len(params) != len(tasks) or temperatures is not None):
            raise ValueError("per-task GenParams: one per task, and no per-sample temperatures beside them")
        was_training = self.model.training
        self.model.eval()
        encoded = [self.encode_task(t) for t in tasks]
        flat = [(g, task, ids) for g, (task, ids) in enumerate(zip(tasks, encoded)) for _ in range(n)]
        out: list[Sample | None] = [None] * len(flat)
        groups = _GroupTracker(out, n, on_ready)
        size = self._chunk_rows(len(flat))
        if isinstance(params, list):
            rows = [params[g] for g, _, _ in flat]
            for start in range(0, len(flat), size):
                chunk = list(range(start, min(start + size, len(flat))))
                self._generate_into(out, chunk, flat, [rows[i] for i in chunk], generator, groups)
            self.model.train(was_training)
            return out
        temps = temperatures or [params.temperature] * len(flat)
        for temp in sorted(set(temps)):
            idx = [i for i, t in enumerate(temps) if t == temp]
            for start in range(0, len(idx), size):
                chunk = idx[start : start + size]
                self._generate_into(out, chunk, flat, replace(params, temperature=temp), generator, groups)
        self.model.train(was_training)
        return out

    def _chunk_rows(self, rows: int) -> int:
        """Rows per backend call: all of them where the backend batches continuously through
        `max_batch` slots (`rollout.continuous_batching`), else chunks of `max_batch`."""
        whole = self.rollout.continuous_batching and SAMPLING_BACKENDS.facts(self.rollout.backend).continuous_batching
        return max(rows, 1) if whole else self.max_batch

    def _generate_into(self, out, chunk: list[int], flat, params: GenParams | list[GenParams], generator,
                       groups) -> None:
        t0 = time.perf_counter()

        def done(rows: list[int], gens: list) -> None:  # rows of this chunk that just finished
            for r, gen in zip(rows, gens):
                out[chunk[r]] = self._to_sample(flat[chunk[r]], gen, params[r] if isinstance(params, list) else params)
            groups.finished([chunk[r] for r in rows])

        self.generate([flat[i][2] for i in chunk], params, generator, on_done=done)
        share, sync = (time.perf_counter() - t0) / len(chunk), self.take_sync_s() / len(chunk)
        for i in chunk:
            out[i].timings["sample_s"] = share
            out[i].timings["sync_s"] = sync

    def _to_sample(self, item, gen, params: GenParams) -> Sample:
        g, task, ids = item
        text = self.decode(gen.token_ids)
        for stop in params.stop_strings:
            text = text.split(stop, 1)[0]
        return Sample(
            task=task, group=g, prompt_ids=ids, completion_ids=gen.token_ids, logprobs=gen.logprobs,
            text=text, finish_reason=gen.finish_reason, temperature=params.temperature,
            policy_version=self.version, timings={"sample_s": 0.0},  # the chunk's share, set when it ends
        )


def prompt_ids(tok, task: Task, tools: list[dict] | None = None) -> list[int]:
    """The prompt's token ids. A tokenizer with a chat template gets the task's chat messages
    (system and user turns; `prompt` as the one user message when the domain gives none) through
    its template, with the assistant turn opened; `tools` (JSON schemas) go to a template that
    renders them (`Policy.renders_tools`). One without (the built-in character models) gets
    `prompt` as plain text: its model was never taught chat turns."""
    if getattr(tok, "chat_template", None):
        messages = list(task.messages) if task.messages else [{"role": "user", "content": task.prompt}]
        extra = {"tools": tools} if tools else {}
        # return_dict=False: transformers 5 otherwise returns a BatchEncoding (list() of it gives its keys)
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=False, **extra))
    return tok(task.prompt)["input_ids"]


class _GroupTracker:
    """Counts each group's finished samples; hands whole groups to `on_ready` as they complete."""

    def __init__(self, out: list, n: int, on_ready):
        self.out, self.n, self.on_ready = out, n, on_ready
        self.left = [n] * (len(out) // n)

    def finished(self, flat_idx: list[int]) -> None:
        complete = []
        for i in flat_idx:
            self.left[i // self.n] -= 1
            if self.left[i // self.n] == 0:
                complete.append(i // self.n)
        if complete and self.on_ready is not None:
            self.on_ready([self.out[g * self.n + j] for g in sorted(complete) for j in range(self.n)])
