"""Continuous batching for postrl's own engine: a call of more prompts than slots.

    gens = generate_slots(model, prompts, params, eos_id, pad_id, generator=g, decode=decode, slots=64)

`generate` decodes every row of its call at once; a caller that must bound the KV cache (`Policy`,
`rollout.max_num_seqs`) cuts a larger call into chunks that run one after another, each until its
longest row ends, so with skewed lengths most of a chunk's late steps decode a few long rows. Here
at most `slots` rows decode at once, and a row that finishes (EOS, a stop string, its token limit)
gives its slot to the next waiting prompt at once. What this module does not know:
tokenizers, tasks, `Policy`; it is `generate`'s sampling, stop strings and finished rows (imported
from there) around a cache with slots.

The draws. `generate` draws U[t] = rand(n) over all n original rows at token step t, and row i's
t-th token uses U[t][i]. Here U[t] is drawn the first time a live row is about to sample its t-th
token. A row joins at token 0, whose block is drawn already, and the furthest token of any live
row grows by at most one a step, so the blocks are drawn in the order t = 0, 1, 2, ..., one per
token of the longest row: the generator gives the same numbers to the same rows, and is left in
the same state, as `generate` on all n rows in one batch. A row's completion does not depend on
when it got a slot: the same tokens, log-probs equal to float rounding (its batch-mates and the
cache columns around it differ). They are not the draws of `Policy`'s chunks without continuous
batching (each chunk drawing after the previous one ended), which differ from those of one batch
whenever a call has more rows than slots.

The cache. One static cache of `slots` rows, written at one shared column a step as `generate`
writes it. A row joins as soon as a slot frees, before the next step: its prompt (prefilled in
waves: the distinct prompts of the next `slots` waiting rows, each once, its rows copying its
cache rows) is copied to end just before that column, its first token is drawn from the prompt's
logits at once, and the next step feeds it there with the other rows' tokens, so a freed slot
never idles a step. The columns before its prompt are masked. Attention reads from the first
column of the oldest live row on; when the shared column reaches the end of the cache, the live
columns move back to its start (the cache is half as long again as one row needs, so this happens
at most once every (prompt + completion) / 2 steps).
When no prompt waits any more, finished rows are dropped from the batch as `generate` drops them.

The Hugging Face path (a model `FastLM` does not cover) has a dynamic cache with no slot to reset:
it runs the call in chunks of `slots` rows one after another, today's behaviour without continuous
batching, and says so in one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from postrl.model.fastlm import FastLM, padding_bias, shared_prefixes
from postrl.sampling.generate import Generation, GenParams, RowParams, Rows, StopCheck, generate, left_pad
from postrl.sampling.graphs import DecodeGraphs

_log = logging.getLogger("postrl.sampling.continuous")

_FREE = 1 << 62
"""The first column of a slot whose row has finished: it holds back neither attention nor a move."""


@torch.no_grad()
def generate_slots(
    model,
    prompts: list[list[int]],
    params: GenParams | list[GenParams],
    eos_id: int,
    pad_id: int,
    generator: torch.Generator | None = None,
    decode=None,
    *,
    slots: int,
    compact_below: float = 0.75,
    on_done: Callable[[list[int], list[Generation]], None] | None = None,
    graphs: DecodeGraphs | None = None,
) -> list[Generation]:
    """`generate`'s completions, with at most `slots` rows decoding at once (see the module
    docstring). A call of at most `slots` prompts is `generate` itself (with `graphs`, its decode
    step's CUDA graphs); the slot loop of a larger call decodes eagerly."""
    longest = max(p.max_new_tokens for p in (params if isinstance(params, list) else [params]))
    if len(prompts) <= slots or longest == 0:
        return generate(model, prompts, params, eos_id, pad_id, generator, decode,
                        compact_below=compact_below, on_done=on_done, graphs=graphs)
    lm = FastLM.wrap(model)
    if lm is None:
        _log.info("continuous batching needs the fused FastLM path: %d prompts run in chunks of %d",
                  len(prompts), slots)
        return _in_chunks(model, prompts, params, eos_id, pad_id, generator, decode, slots, compact_below, on_done)
    rp = RowParams(params, len(prompts), lm.device)
    out = Rows(len(prompts), rp.steps, rp.limits, on_done, lm.device)
    stop_hit = StopCheck(rp.stops, decode) if any(rp.stops) and decode is not None else None
    store = _Prompts(lm, prompts, pad_id, rp.steps, wave_rows=slots)
    _slot_loop(store, _SlotCache(lm, slots, store.width, rp.steps), rp, eos_id, generator, stop_hit,
               compact_below, out)
    return out.finish()


def _in_chunks(model, prompts, params, eos_id, pad_id, generator, decode, slots: int, compact_below: float,
               on_done) -> list[Generation]:
    """`generate` on chunks of `slots` prompts in turn, as `Policy` cuts a call without continuous batching."""
    out: list[Generation] = []
    for start in range(0, len(prompts), slots):
        end = min(start + slots, len(prompts))
        part = params[start:end] if isinstance(params, list) else params
        done = None if on_done is None else (lambda rows, gens, s=start: on_done([s + r for r in rows], gens))
        out += generate(model, prompts[start:end], part, eos_id, pad_id, generator, decode,
                        compact_below=compact_below, on_done=done)
    return out


class _Prompts:
    """The prompts' prefill, a wave of distinct prompts at a time: each one's cache columns
    [Hkv, width, D] per layer (left-padded to the call's widest prompt) and next-token logits."""

    def __init__(self, lm: FastLM, prompts: list[list[int]], pad_id: int, steps: int, wave_rows: int):
        self.lm, self.pad_id, self.wave_rows = lm, pad_id, wave_rows
        distinct: dict[tuple[int, ...], int] = {}
        self.of_row = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        """Each row's distinct prompt."""
        self.distinct = list(distinct)
        self.last_row = {u: r for r, u in enumerate(self.of_row)}
        """Each distinct prompt's last row: once it has joined, the prompt's cache rows can go."""
        self.width = max(map(len, self.distinct))
        self.cos, self.sin = lm.rotary(self.width + steps)  # as `generate`'s table: positions < width + steps
        self.layers = lm.layers()
        self.waves: dict[int, _Wave] = {}
        self.made = 0
        """Waves prefilled so far (the next one's key)."""
        self.where: dict[int, tuple[int, int]] = {}
        """distinct prompt -> (its wave, its row there), while prefilled and still needed."""

    def take(self, rows: list[int]) -> list[tuple[list[int], _Wave, torch.Tensor]]:
        """Rows about to join (in order): (their positions in `rows`, the wave holding their prompts,
        the prompts' rows there), one entry per wave. Prefills the next wave where needed."""
        if any(self.of_row[r] not in self.where for r in rows):
            self._prefill(rows[0])
        by_wave: dict[int, tuple[list[int], list[int]]] = {}
        for j, r in enumerate(rows):
            w, i = self.where[self.of_row[r]]
            pos, idx = by_wave.setdefault(w, ([], []))
            pos.append(j)
            idx.append(i)
        taken = [(pos, self.waves[w], torch.tensor(idx, device=self.lm.device)) for w, (pos, idx) in by_wave.items()]
        for r in rows:  # a prompt whose last row joins is done with; a wave with none left goes
            u = self.of_row[r]
            if self.last_row[u] == r:
                w = self.where.pop(u)[0]
                self.waves[w].left -= 1
                if not self.waves[w].left:
                    del self.waves[w]
        return taken

    def _prefill(self, first: int) -> None:
        """Prefill the distinct prompts of rows first .. first + wave_rows - 1 not prefilled yet, as
        `generate` prefills a call's prompts: padding skipped, shared prefixes once."""
        us = list(dict.fromkeys(u for u in self.of_row[first : first + self.wave_rows] if u not in self.where))
        lm = self.lm
        ids, mask = left_pad([list(self.distinct[u]) for u in us], self.pad_id, lm.device)
        ids = F.pad(ids, (self.width - ids.shape[1], 0), value=self.pad_id)  # every wave as wide as the widest prompt
        mask = F.pad(mask, (self.width - mask.shape[1], 0), value=0)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        kv = lm.new_cache(len(us), self.width)
        share = shared_prefixes(ids, mask)
        hidden = lm.hidden(ids, self.cos[pos], self.sin[pos], padding_bias(mask, self.width, lm.dtype), self.layers,
                           kv, 0, share=share)
        logits = lm.logits(hidden[share.slot.view(ids.shape)[:, -1]])  # every prompt ends in the last column
        w, self.made = self.made, self.made + 1
        self.waves[w] = _Wave(kv, logits, mask.sum(-1), len(us))
        self.where.update({u: (w, i) for i, u in enumerate(us)})


class _Wave:
    """Prefilled prompts: cache columns per layer, logits [m, V], real lengths [m]; `left` of them
    still have rows to join."""

    def __init__(self, kv, logits: torch.Tensor, lengths: torch.Tensor, left: int):
        self.kv, self.logits, self.lengths, self.left = kv, logits, lengths, left


class _SlotCache:
    """The decoding rows' static cache [slots, Hkv, capacity, D] per layer, written at one shared
    column a step (`col`); each slot's row starts at its own column (`start`), earlier ones masked."""

    def __init__(self, lm: FastLM, slots: int, width: int, steps: int):
        self.lm, self.width = lm, width
        span = width + steps  # one row's prompt and completion
        self.capacity = span + max(8, span // 2)
        self.kv = lm.new_cache(slots, self.capacity)
        self.key_bias = torch.zeros((slots, 1, 1, self.capacity), dtype=lm.dtype, device=lm.device)
        self.cols = torch.arange(self.capacity, device=lm.device)
        self.next_pos = torch.zeros(slots, dtype=torch.long, device=lm.device)
        self.start = [_FREE] * slots
        """Each slot's first column (its prompt's first real token); `_FREE` once its row finished."""
        self.col = width  # the column the next step writes; a prompt always fits before it

    def place(self, slots: torch.Tensor, wave: _Wave, idx: torch.Tensor) -> None:
        """Prompts `idx` of `wave` into `slots`, ending just before `col`."""
        c, w = self.col, self.width
        for (kc, vc), (ks, vs) in zip(self.kv, wave.kv):
            kc[slots, :, c - w : c] = ks[idx]
            vc[slots, :, c - w : c] = vs[idx]
        lengths = wave.lengths[idx]
        first = c - lengths  # [k]
        self.key_bias[slots, 0, 0] = torch.zeros((), dtype=self.key_bias.dtype, device=first.device).masked_fill(
            self.cols[None] < first[:, None], float("-inf"))
        self.next_pos[slots] = lengths
        for s, f in zip(slots.tolist(), first.tolist()):
            self.start[s] = f

    def free(self, slots: list[int]) -> None:
        for s in slots:
            self.start[s] = _FREE
        # a finished row steps on until its slot is taken or dropped: keep its positions in the table
        self.next_pos[slots] = 0

    def step(self, tok: torch.Tensor, layers, cos, sin) -> torch.Tensor:
        """Feed one token per slot: next-token logits [slots, V]."""
        if self.col == self.capacity:
            self._move_back()
        lo = min(min(self.start), self.col)
        pos = self.next_pos[:, None]
        kv = [(k[:, :, lo:], v[:, :, lo:]) for k, v in self.kv]  # views: writes land in the cache
        bias = self.key_bias[..., lo : self.col + 1]
        hidden = self.lm.hidden(tok[:, None], cos[pos], sin[pos], bias, layers, kv, self.col - lo)
        self.col += 1
        self.next_pos += 1
        return self.lm.logits(hidden[:, -1])

    def _move_back(self) -> None:
        """Move the live columns to the start of the cache, keeping `col` past a whole prompt."""
        shift = min(min(self.start), self.col - self.width)
        c = self.col
        for k, v in self.kv:
            k[:, :, : c - shift] = k[:, :, shift:c].clone()
            v[:, :, : c - shift] = v[:, :, shift:c].clone()
        self.key_bias[..., : c - shift] = self.key_bias[..., shift:c].clone()
        self.key_bias[..., c - shift :] = 0.0
        self.start = [s - shift if s != _FREE else s for s in self.start]
        self.col -= shift

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only these slots (no prompt waits any more)."""
        self.kv = [(k[idx], v[idx]) for k, v in self.kv]
        self.key_bias, self.next_pos = self.key_bias[idx], self.next_pos[idx]
        self.start = [self.start[i] for i in idx.tolist()]


class _Draws:
    """The uniform draws U[t] = rand(n) of every original row, drawn in order the first time a live
    row reaches token t (see the module docstring)."""

    def __init__(self, n: int, steps: int, generator, device):
        self.n, self.generator, self.device = n, generator, device
        self.on = generator.device if generator is not None else torch.device("cpu")
        self.u = torch.empty((steps, n), device=device)
        self.drawn = 0

    def of(self, slot_row: torch.Tensor, slot_t: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Each slot's draw for the token it samples now (finished slots: any drawn value)."""
        t = slot_t.masked_fill(~live, 0)
        while self.drawn <= int(t.max()):
            self.u[self.drawn] = torch.rand(self.n, generator=self.generator, device=self.on).to(self.device)
            self.drawn += 1
        return self.u[t, slot_row]


def _slot_loop(store: _Prompts, cache: _SlotCache, params: RowParams, eos_id: int, generator, stop_hit,
               compact_below: float, out: Rows) -> None:
    """The per-token loop over the slots, admitting waiting rows as slots free, writing into `out`."""
    n, device = len(store.of_row), cache.lm.device
    width = len(cache.start)
    draws = None if params.all_greedy else _Draws(n, params.steps, generator, device)
    take = _Taker(params, eos_id, draws, stop_hit, out)
    slot_row = torch.arange(width, device=device)  # the original row in each slot
    slot_t = torch.zeros(width, dtype=torch.long, device=device)  # the token each slot samples now
    live = torch.ones(width, dtype=torch.bool, device=device)
    logits = _admit(store, cache, list(range(width)), list(range(width)))
    waiting = width  # the next row to join
    while True:
        tok, done = take(logits, slot_row, slot_t, live)
        slot_t += 1
        live &= ~done
        freed = done.nonzero().squeeze(-1).tolist() if done.any() else []
        while freed and waiting < n:  # the next rows join and take their first token now, from their prompt
            cache.free(freed)
            at = torch.tensor(freed[: n - waiting], device=device)
            rows = list(range(waiting, waiting + len(at)))
            first = _admit(store, cache, at.tolist(), rows)
            slot_row[at], slot_t[at], live[at] = torch.tensor(rows, device=device), 0, True
            waiting += len(rows)
            tok[at], ended = take(first, slot_row[at], slot_t[at], live[at])
            slot_t[at], live[at] = 1, ~ended
            freed = at[ended].tolist()  # rows done at their first token free their slot again
        cache.free(freed)
        n_live = int(live.sum())
        if waiting == n:
            if n_live == 0:
                break
            if n_live <= compact_below * len(slot_row):  # nobody waits: drop finished rows, as `generate` does
                keep = live.nonzero().squeeze(-1)
                cache.keep(keep)
                slot_row, slot_t, live, tok = slot_row[keep], slot_t[keep], live[keep], tok[keep]
        logits = cache.step(tok, store.layers, store.cos, store.sin)  # finished rows still in the batch step on


class _Taker:
    """Sample the slots' next tokens, write the live rows' into `out`, and finish the rows that end
    (EOS, a stop string, their limit): `generate`'s rules, at each slot's own token step."""

    def __init__(self, params: RowParams, eos_id: int, draws: _Draws | None, stop_hit, out: Rows):
        self.params, self.eos_id, self.draws, self.stop_hit, self.out = params, eos_id, draws, stop_hit, out

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, t: torch.Tensor, live: torch.Tensor):
        """logits [k, V] of slots holding original rows `rows` [k] at token steps `t` [k]: (tokens [k],
        done [k]: the live rows that ended)."""
        out = self.out
        uniform = None if self.draws is None else self.draws.of(rows, t, live)
        tok, lp = self.params.pick(logits, rows, uniform)
        idx, t_live = rows[live], t[live]
        out.tokens[idx, t_live], out.logprobs[idx, t_live] = tok[live], lp[live]
        end = live & (tok == self.eos_id)
        if self.stop_hit is not None:
            end |= self.stop_hit(out.tokens, rows, live, t)
        done = end | (live & (self.params.limits[rows] <= t + 1))
        if done.any():
            out.lengths[rows[end]] = t[end] + 1
            out.stopped[rows[end]] = True
            out.ended(rows[done])
        return tok, done


def _admit(store: _Prompts, cache: _SlotCache, slots: list[int], rows: list[int]) -> torch.Tensor:
    """Rows `rows` take `slots`: their prompts copied into the cache. Returns their prompts'
    next-token logits [len(rows), V]."""
    logits: torch.Tensor | None = None
    for pos, wave, idx in store.take(rows):
        at = torch.tensor([slots[j] for j in pos], device=cache.lm.device)
        cache.place(at, wave, idx)
        if logits is None:
            logits = wave.logits.new_empty((len(rows), wave.logits.shape[-1]))
        logits[torch.tensor(pos, device=logits.device)] = wave.logits[idx]
    return logits
