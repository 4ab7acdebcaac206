"""The decode step as a CUDA graph (`rollout.cuda_graphs`): one static step per batch-size bucket.

    graphs = decode_graphs("auto", model, max_rows=512)    # None: decode eagerly (and why, logged)
    gens = generate(model, prompts, params, eos_id, pad_id, gen, graphs=graphs)

What is captured. One decode step of `generate`'s loop, from the token each row was given to the
token it samples next: the embedding, every layer (the static KV cache written in place at the
step's column), the head, and the sampling (temperature, top-p, greedy, the per-token log-prob),
with the positions and the write column advanced on the device. Its inputs are static tensors the
loop writes before a replay (the fed tokens, the uniform draws); its outputs are static tensors it
reads after one (the next tokens, their log-probs). Nothing inside reads a tensor's value on the
host (no `.item()`, no branch on a tensor): the loop's bookkeeping (EOS, token limits, stop strings,
which rows to drop) stays outside, as in `generate`. Prefill is not captured (its shape is the
prompts'), nor is the first token, sampled from the prompts' logits by `generate`'s `pick_tokens`.

The buckets. A static step is made for (rows, cache length, top-p or not): rows padded up to the
next power of two (padding rows decode token 0 at position 0 and are ignored), the cache to the
next power of two of at least 256 columns, attention over all of them with the key bias masking
the columns past the step's (computed inside the step from the column tensor). A bucket's step is
made on first use and kept for the backend's life (`DecodeGraphs`), so a run captures each bucket
once, not once per step; when `generate` drops finished rows, the live rows move into the smaller
bucket's cache. Calls of more rows than the largest bucket (above `rollout.max_num_seqs`) decode
eagerly, with one log line; so does a call made while another thread's call holds the steps (their
buffers serve one call at a time). On CUDA a bucket's first two steps run eagerly on a side stream (the
warm-up capture asks for), the third captures it (thread-local capture mode: a learner thread may
run kernels meanwhile) and replays; every bucket's graph shares one memory pool, which is safe
because no step's result lives in the pool (they are copied into static tensors inside the step).
A capture that fails (it has not yet run on a GPU) makes `auto` decode through the same steps
eagerly from then on, with one warning; under `on` it is a one-line ConfigError.

Weights. The step reads the model's own parameters where `FastLM.layers()` hands them over as
they are (norms, o and down projections; the embedding and head), and its own copies of what
`layers()` builds by concatenation (the fused q/k/v and gate/up weights; with LoRA, every projection
with its factors folded in). Every `generate` call copies the current weights into those copies
(`DecodeGraphs.refresh`, `copy_` into the storage the graphs read); the learner updates the
parameters in place, which the graphs see as they are: a new policy version never re-captures. A
parameter the model replaced by another tensor (not updated in place) is out of the graphs' reach:
they are then made again, with one log line. The fused copies cost the memory of the q/k/v and
gate/up weights once more (of all seven projections with LoRA).
The layers run `FastLM.hidden`'s own functions (`_before_attention`, `_after_attention`,
`_one_query_attention`), so the floats are its floats; `hidden` itself takes the write column as a
Python int, which a graph would bake in.

The same code on the CPU, and what it matches. There nothing is captured: `DecodeGraphs(lm,
capture=False)` runs the static step eagerly. With `exact=True` (the batch's own row count,
attention over the columns written so far) it gives `generate`'s eager decode bit for bit in
float32: tokens, log-probs, finish reasons and the generator's end state (tests/test_cuda_graphs.py,
sampled, greedy, top-p and mixed rows with compaction, on two test models). At the captured shapes
the tokens are the same and log-probs differ by float rounding (under 5e-7 on the test models; the
test bounds it at 2e-6), for two reasons found on this CPU's torch (2.13, MKL): its sgemm computes a
row differently when the call has fewer than 8 rows (a linear layer over 6 rows vs over those 6
padded to 8), and attention's matmuls and softmax over 256 columns sum in another order than over
the 13 written (zeros and masked columns are exact, the order is not). `rollout.cuda_graphs: auto`
is off on the CPU, so no default run decodes through here.

Not measured here (no GPU was lent to the session that wrote this): the capture itself, replay
speed, memory of the graphs, and whether CUDA's eager one-temperature path (a Python-float
temperature, which CUDA divides by as a reciprocal multiply) and this step (a per-row temperature
tensor, a true division) give bitwise equal log-probs there; the GPU lease checks the tokens.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import fields

import torch
import torch.nn.functional as F

from postrl.model.fastlm import FastLM, _after_attention, _before_attention, _one_query_attention

_log = logging.getLogger("postrl.sampling.graphs")

WARMUP_STEPS = 2
"""Eager steps of a bucket, on a side stream, before it is captured (CUDA only)."""
MIN_CACHE = 256
"""The shortest cache bucket, in columns."""


def _power_of_two(n: int, least: int = 1) -> int:
    return max(least, 1 << max(n - 1, 0).bit_length())


def decode_graphs(setting: str, model, max_rows: int) -> DecodeGraphs | None:
    """`rollout.cuda_graphs` for `model`: the backend's `DecodeGraphs`, or None (decode eagerly).
    auto: graphs where the model is on CUDA and on the fused path, else None with one log line;
    on: a one-line ConfigError where they cannot be; off: None."""
    if setting == "off":
        return None
    lm = FastLM.wrap(model)
    why = ("the model does not run on the fused FastLM path" if lm is None
           else f"the model is on {lm.device.type}, not a CUDA device" if lm.device.type != "cuda" else "")
    if why and setting == "on":
        # imported here: benchmarks/gpu_step.py runs with postrl's model, sampling and learner packages alone
        from postrl.errors import ConfigError

        raise ConfigError(f"config key 'rollout.cuda_graphs' = 'on': {why}")
    if why:
        _log.info("rollout.cuda_graphs: auto: the decode step runs eagerly: %s", why)
        return None
    return DecodeGraphs(lm, capture=True, max_rows=max_rows, strict=setting == "on")


class DecodeGraphs:
    """The static decode steps of one model, by bucket, kept for the owner's life (see the module
    docstring). `capture`: CUDA graphs; False: the same steps eagerly (the CPU, tests)."""

    def __init__(self, lm: FastLM, capture: bool, max_rows: int, exact: bool = False, strict: bool = False):
        if capture and exact:
            raise ValueError("exact shapes follow the batch and a host-side column count, which a captured step cannot")
        self.lm, self.capture, self.exact = lm, capture, exact
        self.strict = strict
        """A capture that fails is an error (`rollout.cuda_graphs: on`); else (auto) the steps run
        eagerly from then on, with one log line."""
        """exact (eager only, for tests): the batch's own row count and attention over the columns
        written so far, as `generate`'s eager decode has them, rather than the buckets' padded rows
        and whole cache; the two round differently on a CPU (see the module docstring)."""
        self.max_rows = _power_of_two(max_rows)
        """The largest rows bucket; a call of more rows decodes eagerly."""
        with torch.no_grad():
            self.layers = lm.layers()  # the storage every step reads; `refresh` writes into it
        self.outer = _outer(lm)
        """The model's embedding, final norm and head weights (head bias or None) the steps read."""
        self.steps: dict[tuple[int, int, bool], StaticStep] = {}
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        """The memory pool every captured graph shares."""
        self.warned: set[str] = set()
        """The reasons to decode a call eagerly already logged (once each)."""
        self.lock = threading.Lock()
        """Held by the call decoding through the steps: their buffers serve one call at a time."""

    def refresh(self, layers) -> None:
        """Copy the current weights (`lm.layers()` of this call) into the tensors the steps read that
        are copies (the fused ones); the model's own parameters are read where they are. A parameter
        the model replaced by another tensor (not updated in place) cannot be reached that way: the
        steps are then made (and captured) again, on these weights, with one log line."""
        outer = _outer(self.lm)
        pairs = [*zip(self.outer, outer),
                 *((getattr(mine, f.name), getattr(now, f.name)) for mine, now in zip(self.layers, layers)
                   for f in fields(mine))]
        if any((isinstance(a, torch.nn.Parameter) and a is not b) or (a is None) != (b is None) for a, b in pairs):
            _log.info("rollout.cuda_graphs: the model's parameters were replaced, not updated in place: "
                      "the decode steps are made again")
            self.layers, self.outer, self.steps, self.pool = layers, outer, {}, None
            return
        for a, b in pairs:
            if torch.is_tensor(a) and a is not b:
                a.copy_(b)

    def step(self, n: int, length: int, truncate: bool) -> StaticStep:
        """The static step of the bucket holding `n` rows (length, top-p), made on first use."""
        rows = n if self.exact else _power_of_two(n)
        key = (rows, length, truncate)
        if key not in self.steps:
            if length not in self.tables:
                self.tables[length] = self.lm.rotary(length)
            self.steps[key] = StaticStep(self, rows, length, truncate)
        return self.steps[key]

    def stepper(self, fast, params, n: int) -> GraphStepper | None:
        """`generate`'s stepper for a call of `n` rows whose prompts `fast` (a `_FastStepper`, its
        rows already those of the call) has prefilled, to be closed when the call ends; None (decode
        eagerly, one log line) when the call has more rows than the largest bucket, or while another
        thread's call holds the steps (an eval beside the threaded engine's sampling)."""
        why = (f"a call of more rows than the largest bucket ({self.max_rows})" if n > self.max_rows
               else "" if self.lock.acquire(blocking=False) else "a call while another one decodes through the steps")
        if why:
            if why not in self.warned:
                _log.info("rollout.cuda_graphs: %s decodes eagerly", why)
                self.warned.add(why)
            return None
        try:
            self.refresh(fast.layers)
            return GraphStepper(self, fast, params, n)
        except BaseException:
            self.lock.release()
            raise


class StaticStep:
    """One bucket's decode step on static tensors (see the module docstring)."""

    def __init__(self, owner: DecodeGraphs, rows: int, length: int, truncate: bool):
        lm, dev = owner.lm, owner.lm.device
        self.owner, self.rows, self.length, self.truncate = owner, rows, length, truncate
        self.kv = lm.new_cache(rows, length)
        self.key_bias = torch.zeros((rows, 1, 1, length), dtype=lm.dtype, device=dev)
        """0 or -inf per row and column (prompt padding); columns past `col` are masked in the step."""
        self.cols = torch.arange(length, device=dev)
        self.col = torch.zeros(1, dtype=torch.long, device=dev)
        """The column this step writes (one for all rows)."""
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)
        self.uniform = torch.zeros(rows, device=dev)
        self.temperature = torch.ones((rows, 1), device=dev)
        self.greedy = torch.ones(rows, dtype=torch.bool, device=dev)
        self.top_p = torch.ones((rows, 1), device=dev)
        self.next_tok = torch.zeros(rows, dtype=torch.long, device=dev)
        self.logprob = torch.zeros(rows, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = 0

    def run(self, written: int) -> None:
        """One step: eager, or (CUDA) warm-up, capture, replay. `written`: the step's column + 1,
        read only by an eager step with `exact`."""
        owner = self.owner
        if self.graph is not None:
            self.graph.replay()
        elif not owner.capture:
            self._forward(written if owner.exact else self.length)
        else:
            try:
                self._warm_or_capture()
            except Exception as e:  # never yet run on a GPU: auto keeps sampling, eagerly
                reason = (str(e).splitlines() or [type(e).__name__])[0][:300]
                if owner.strict:
                    from postrl.errors import ConfigError  # here: see decode_graphs

                    raise ConfigError(f"config key 'rollout.cuda_graphs' = 'on': the decode step could not be "
                                      f"captured: {type(e).__name__}: {reason}") from e
                _log.warning("rollout.cuda_graphs: auto: capturing the decode step failed (%s: %s); it runs "
                             "eagerly from now on", type(e).__name__, reason)
                owner.capture = False
                self._forward(self.length)  # the step the failed capture did not compute

    def _warm_or_capture(self) -> None:
        """CUDA: the bucket's first steps eagerly on a side stream (as capture asks), then its capture
        and first replay."""
        owner = self.owner
        if self.warm < WARMUP_STEPS:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(self.length)
            torch.cuda.current_stream().wait_stream(side)
            self.warm += 1
            return
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=owner.pool, capture_error_mode="thread_local"):
            self._forward(self.length)  # recorded, not run
        owner.pool, self.graph = graph.pool(), graph
        graph.replay()

    def _forward(self, seen: int) -> None:
        """The captured region: `FastLM.hidden`'s ops for one token a row, then `pick_static`.
        Attention reads the cache's first `seen` columns (all of them when captured)."""
        lm, owner, b = self.owner.lm, self.owner, self.rows
        cos, sin = owner.tables[self.length]
        pos = self.pos[:, None]
        bias = self.key_bias[..., :seen].masked_fill(self.cols[:seen] > self.col, float("-inf"))  # [R, 1, 1, seen]
        embed, norm, head_w, head_b = owner.outer
        x = F.embedding(self.tok[:, None], embed, padding_idx=lm.model.model.embed_tokens.padding_idx)  # [R, 1, H]
        cos, sin = cos[pos][..., None, :], sin[pos][..., None, :]
        h, hk, d = lm.heads, lm.kv_heads, lm.head_dim
        for (kc, vc), w in zip(self.kv, owner.layers):
            qk, v = _before_attention(x, w.ln1, lm.eps, w.qkv_w, w.qkv_b, w.qkv_lora, cos, sin, h, hk)
            q, k, v = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), v.transpose(1, 2)
            kc.index_copy_(2, self.col, k)
            vc.index_copy_(2, self.col, v)
            att = _one_query_attention(q, kc[:, :, :seen], vc[:, :, :seen], bias).transpose(1, 2).reshape(b, 1, h * d)
            x = _after_attention(x, att, w.o_w, w.o_b, w.o_lora, w.ln2, lm.eps, w.gate_up_w, w.gate_up_b,
                                 w.gate_up_lora, w.down_w, w.down_b, w.down_lora, lm.act)
        x = F.rms_norm(x, (x.shape[-1],), norm, lm.eps)
        logits = F.linear(x[:, -1], head_w, head_b)  # [R, V], as `FastLM.logits`
        tok, lp = pick_static(logits, self.uniform, self.temperature, self.greedy,
                              self.top_p if self.truncate else None)
        self.next_tok.copy_(tok)
        self.logprob.copy_(lp)
        self.pos += 1
        self.col += 1


def pick_static(logits: torch.Tensor, uniform: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                top_p: torch.Tensor | None):
    """`generate.pick_tokens` with per-row settings and no branch on a tensor's value: logits [R, V],
    uniform [R], temperature [R, 1], greedy [R], top_p [R, 1] or None (no row truncates).
    Returns (tokens [R], logprobs [R]), the values `pick_tokens` gives."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [R, V]
    probs = logp.exp()
    if top_p is not None:  # a Python choice, fixed per bucket: the graph has it or not
        sorted_p, order = probs.sort(-1, descending=True)
        # rows at top_p 1 keep every token, as `pick_tokens` without truncation does (the cumulative
        # sum can pass 1.0 by rounding, which would drop tail tokens)
        drop = (sorted_p.cumsum(-1) - sorted_p > top_p) & (top_p < 1.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.cumsum(-1)  # [R, V]
    target = (uniform * cdf[:, -1])[:, None]
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(-1), drawn)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class GraphStepper:
    """`generate`'s stepper over the static steps: `step(tok)` feeds the batch's tokens and returns
    None (no logits: the next tokens are sampled inside the step), `sample(rows, uniform)` runs the
    step and returns (tokens [n], logprobs [n]), `keep(idx)` drops rows, into a smaller bucket."""

    def __init__(self, owner: DecodeGraphs, fast, params, n: int):
        self.owner, self.n = owner, n
        dev = owner.lm.device
        one = params.one
        self.settings = ((torch.full((n, 1), one.temperature, device=dev), torch.full((n,), one.greedy, device=dev),
                          torch.full((n, 1), one.top_p, device=dev)) if one is not None
                         else (params.temperature, params.greedy, params.top_p))
        """temperature [n, 1], greedy [n], top_p [n, 1] of each original row."""
        self.truncate = bool((self.settings[2] < 1.0).any())
        self.length = _power_of_two(fast.kv[0][0].shape[2], MIN_CACHE)
        self.static = owner.step(n, self.length, self.truncate)
        self.rows: torch.Tensor | None = None
        """The loop's original-row indices the settings were last written for."""
        st, width = self.static, fast.width
        for (kc, vc), (kf, vf) in zip(st.kv, fast.kv):
            kc[:n, :, :width] = kf[:, :, :width]
            vc[:n, :, :width] = vf[:, :, :width]
        st.key_bias[:n, ..., :width] = fast.key_bias[..., :width]
        st.key_bias[:n, ..., width:] = 0.0
        st.pos[:n] = fast.next_pos
        st.col.fill_(fast.col)
        self.written = fast.col
        """Columns written before this step (the static step's `col`, known on the host)."""
        _clear_padding(st, n)

    def close(self) -> None:
        """The call has ended: the steps are free for the next."""
        self.owner.lock.release()

    def step(self, tok: torch.Tensor) -> None:
        self.static.tok[: self.n] = tok

    def sample(self, rows: torch.Tensor, uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        st, n = self.static, self.n
        if rows is not self.rows:  # new rows since the last step (the call's first, or compaction)
            self.rows = rows
            for mine, every in zip((st.temperature, st.greedy, st.top_p), self.settings):
                mine[:n] = every[rows]
        if uniform is not None:
            st.uniform[:n] = uniform
        st.run(self.written + 1)
        self.written += 1
        return st.next_tok[:n].clone(), st.logprob[:n].clone()

    def keep(self, idx: torch.Tensor) -> None:
        """Keep these rows of the batch, in the smallest bucket that holds them."""
        old, m = self.static, len(idx)
        new = self.owner.step(m, self.length, self.truncate)
        for (kn, vn), (ko, vo) in zip(new.kv, old.kv):
            kn[:m] = ko[idx]  # the right side is gathered first: safe when new is old
            vn[:m] = vo[idx]
        new.key_bias[:m], new.pos[:m], new.tok[:m] = old.key_bias[idx], old.pos[idx], old.tok[idx]
        new.col.copy_(old.col)
        self.static, self.n, self.rows = new, m, None
        _clear_padding(new, m)


def _outer(lm: FastLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The model's weights outside its layers: embedding, final norm, head weight and bias."""
    head = lm.model.lm_head
    return lm.model.model.embed_tokens.weight, lm.model.model.norm.weight, head.weight, head.bias


def _clear_padding(st: StaticStep, n: int) -> None:
    """Rows n.. of a bucket decode token 0 at position 0 with every column visible: finite values,
    never a fully masked row (NaN there would reach the cache, and a later call's zero weights
    times NaN is NaN)."""
    st.key_bias[n:] = 0.0
    st.pos[n:] = 0
    st.tok[n:] = 0
    st.uniform[n:] = 0.0
    st.greedy[n:] = True
