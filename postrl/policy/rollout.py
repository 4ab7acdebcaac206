"""Batched sampling with a KV cache: the CPU rollout engine.

    out = generate(model, prompts, GenParams(max_new_tokens=8, temperature=1.0), eos_id, pad_id)
    out[i].token_ids, out[i].logprobs, out[i].finish_reason

Prompts of mixed lengths are left-padded so that every sequence's next token sits in the last
column; position ids count real tokens only, so padding changes nothing a sequence sees.
Behaviour log-probs are those of the distribution actually sampled from *before* top-p
truncation: log softmax(logits / temperature). The update recomputes the same quantity, so the
PPO ratio is exactly 1 on the first on-policy pass (top-p truncation is the one departure; keep
top_p=1 for exact on-policy ratios).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def pick_tokens(logits: torch.Tensor, params: GenParams, generator: torch.Generator | None):
    """Choose the next token per row. logits: [B, V]. Returns (tokens [B], logprobs [B])."""
    logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)  # [B, V]
    if params.greedy:
        tokens = logp.argmax(-1)
    else:
        probs = logp.exp()
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest prefix reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    params: GenParams,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator | None = None,
    decode=None,
) -> list[Generation]:
    """Sample one completion per prompt. `decode(ids) -> str` is needed only for stop strings."""
    ids, mask = left_pad(prompts, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache, logits = out.cache, out.logits[:, -1]
    batch = len(prompts)
    tokens = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.long)
    logprobs = torch.zeros((batch, params.max_new_tokens))
    lengths = torch.zeros(batch, dtype=torch.long)
    done = torch.zeros(batch, dtype=torch.bool)
    next_pos = positions[:, -1] + 1
    for t in range(params.max_new_tokens):
        tok, lp = pick_tokens(logits, params, generator)
        live = ~done
        tokens[live, t], logprobs[live, t] = tok[live], lp[live]
        lengths += live.long()
        done |= tok == eos_id
        if params.stop_strings and decode is not None:
            done |= _hit_stop(tokens[:, : t + 1], lengths, live, params.stop_strings, decode)
        if done.all() or t == params.max_new_tokens - 1:
            break
        # finished rows keep stepping on padding (masked out) so the cache stays rectangular
        mask = torch.cat([mask, live.long()[:, None]], dim=1)
        step_in = torch.where(live, tok, torch.full_like(tok, pad_id))[:, None]
        out = model(input_ids=step_in, attention_mask=mask, position_ids=next_pos[:, None], cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1]
        next_pos = next_pos + live.long()
    return [_finish(tokens[i, : lengths[i]].tolist(), logprobs[i, : lengths[i]].tolist(), eos_id, bool(done[i]))
            for i in range(batch)]


def _hit_stop(tokens, lengths, live, stops, decode) -> torch.Tensor:
    hit = torch.zeros(len(lengths), dtype=torch.bool)
    for i in torch.nonzero(live).flatten().tolist():
        text = decode(tokens[i, : lengths[i]].tolist())
        hit[i] = any(s in text for s in stops)
    return hit


def _finish(ids: list[int], lps: list[float], eos_id: int, done: bool) -> Generation:
    return Generation(ids, lps, "stop" if done else "length")
