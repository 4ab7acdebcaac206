"""The learner's forward as a GPU wants it, checked on the CPU (issue 44, item 3).

- Attention: a right-padded batch (the learner's layout) reaches SDPA with `is_causal` and no mask
  tensor, on the fused forward and on Hugging Face's; packed rows run one causal call per sequence;
  a left-padded batch keeps its mask. The log-probs are those of the masked computation.
- The head: the chunked log-softmax keeps no chunk's logits for the backward (saved tensors).
- `train.compile`: the update's loss and weights as in eager mode (inductor, the tiny model), and a
  one-line error where it cannot run.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from postrl.builtin_models import load_model
from postrl.config.schema import LoraConfig, ModelConfig, RLConfig, TrainConfig
from postrl.errors import UserError
from postrl.learner.learner import Learner
from postrl.model import fastlm
from postrl.model import logprobs as logprobs_mod
from postrl.model.fastlm import FastLM
from postrl.model.lora import apply_lora
from postrl.records import Task
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy


def _model(tiny_model_dir, kind: str, monkeypatch):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    if kind == "hf":  # as gradient checkpointing or uncovered adapters run: transformers' own decoder
        monkeypatch.setattr(FastLM, "wrap", classmethod(lambda cls, model, adapters=True: None))
    if kind == "lora":
        torch.manual_seed(0)
        model = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    return model.eval(), tok


def _rows(tok, left: bool = False, n: int = 5, seed: int = 0):
    """Rows of uneven lengths padded on the right (or left), the second half of each the "completion"."""
    rng = random.Random(seed)
    rows = [[rng.randrange(3, len(tok)) for _ in range(rng.randint(5, 14))] for _ in range(n)]
    width = max(map(len, rows))
    ids = torch.full((n, width), tok.pad_token_id)
    attn = torch.zeros((n, width), dtype=torch.long)
    needed = torch.zeros((n, width - 1))
    for i, r in enumerate(rows):
        at = width - len(r) if left else 0
        ids[i, at : at + len(r)], attn[i, at : at + len(r)] = torch.tensor(r), 1
        needed[i, at + len(r) // 2 - 1 : at + len(r) - 1] = 1
    return ids, attn, needed, torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5][:n])


def _right_to_left(values: torch.Tensor, attn_right: torch.Tensor) -> torch.Tensor:
    """[B, T-1] per-position values of right-padded rows, moved to where the left-padded rows hold them."""
    out = torch.zeros_like(values)
    width = attn_right.shape[1]
    for i, n in enumerate(attn_right.sum(-1).tolist()):
        out[i, width - n : width - 1] = values[i, : n - 1]
    return out


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every SDPA call's (query length, key length, attn_mask shape or None, is_causal)."""
    calls = []
    real = F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((q.shape[-2], k.shape[-2], None if attn_mask is None else tuple(attn_mask.shape), is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return calls


@pytest.mark.parametrize("kind", ["fastlm", "lora", "hf"])
def test_a_right_padded_batch_attends_causally_with_no_mask_tensor(tiny_model_dir, kind, monkeypatch, sdpa_calls):
    model, tok = _model(tiny_model_dir, kind, monkeypatch)
    ids, attn, needed, temps = _rows(tok)
    left_ids, left_attn, left_needed, _ = _rows(tok, left=True)
    logp, ent = logprobs_mod.token_logprobs(model, ids, attn, temps, with_entropy=True, needed=needed)
    right_calls = list(sdpa_calls)
    sdpa_calls.clear()
    want, want_ent = logprobs_mod.token_logprobs(model, left_ids, left_attn, temps, with_entropy=True,
                                                 needed=left_needed)
    layers = model.config.num_hidden_layers
    # right-padded: one causal call a layer, no mask; the left-padded rows need theirs, [B, 1, T, T]
    assert len(right_calls) == layers and all(mask is None and causal for *_, mask, causal in right_calls)
    assert len(sdpa_calls) == layers and all(mask is not None and mask[-1] == ids.shape[1] and mask[-2] > 1
                                             for *_, mask, _ in sdpa_calls)
    # the same log-probs: what the mask keeps out of the real tokens' attention, causality does
    torch.testing.assert_close(_right_to_left(logp, attn), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(_right_to_left(ent, attn), want_ent, rtol=0, atol=1e-6)


def test_packed_rows_run_one_causal_call_per_sequence_with_no_mask(tiny_model_dir, monkeypatch, sdpa_calls):
    model, tok = _model(tiny_model_dir, "fastlm", monkeypatch)
    ids, attn, needed, temps = _rows(tok)
    logp, _ = logprobs_mod.token_logprobs(model, ids, attn, temps, needed=needed, pack=True)
    lengths = attn.sum(-1).tolist()
    assert [(q, k) for q, k, *_ in sdpa_calls] == [(n, n) for n in lengths] * model.config.num_hidden_layers
    assert all(mask is None and causal for *_, mask, causal in sdpa_calls)
    padded, _ = logprobs_mod.token_logprobs(model, ids, attn, temps, needed=needed)
    torch.testing.assert_close(logp, padded, rtol=0, atol=1e-6)


def test_the_chunked_head_keeps_no_chunk_of_logits_for_the_backward(tiny_model_dir, monkeypatch):
    """Under autograd a [positions, V] logits tensor is what the backward would keep; chunked, the
    head keeps only its inputs (each chunk is recomputed in the backward), so no saved tensor has a
    row per position and a column per vocabulary word. Unchunked, the same probe finds them, and
    the gradients are the same."""
    model, tok = _model(tiny_model_dir, "fastlm", monkeypatch)
    model.train()
    ids, attn, needed, temps = _rows(tok)
    vocab, n = model.config.vocab_size, int(needed.sum())
    w = torch.randn(needed.shape, generator=torch.Generator().manual_seed(0)) * needed
    out = {}
    for name, mib in (("whole", 1e6), ("chunked", 3 * 4 * vocab / 2**20)):  # chunked: three positions a chunk
        saved = []
        model.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t, seen=saved: (seen.append(tuple(t.shape)), t)[1],
                                                      lambda t: t):
            logp, ent = logprobs_mod.token_logprobs(model, ids, attn, temps, with_entropy=True, entropy_grad=True,
                                                    needed=needed, chunk_mib=mib)
        ((logp * w).sum() + (ent * w).sum()).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        weight = {(vocab, model.config.hidden_size), (model.config.hidden_size, vocab)}  # the head's, kept either way
        logit_rows = [s[0] for s in saved if len(s) == 2 and s[1] == vocab and s not in weight]
        out[name] = (logp.detach(), grads, logit_rows)
    assert out["whole"][2] and max(out["whole"][2]) == n  # the probe sees the logits when they are kept
    assert out["chunked"][2] == []
    torch.testing.assert_close(out["chunked"][0], out["whole"][0], rtol=0, atol=1e-6)
    # gradients to 1e-6 of each one's largest entry: the tied head's gradient sums its chunks in
    # another order (measured 2.4e-6 on entries up to 8.3)
    for k, g in out["whole"][1].items():
        torch.testing.assert_close(out["chunked"][1][k], g, rtol=0, atol=1e-6 * max(1.0, float(g.abs().max())), msg=k)


# ---------------------------------------------------------------------------- train.compile


def _learner(tiny_model_dir, compiled: bool, gradient_checkpointing: bool = False):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    train = TrainConfig(lr=1e-3, minibatches=2, samples_per_prompt=4, compile=compiled)
    return Learner(Policy(model, tok), None, train, RLConfig(kl_coef=0.0),
                   ModelConfig(gradient_checkpointing=gradient_checkpointing)), model


def test_train_compile_gives_the_eager_update(tiny_model_dir):
    """One update (two optimiser steps on minibatches of two shapes) with the layers compiled by
    inductor: the same loss within 1e-5 and the same weights after. The tiny model keeps the
    compilation to seconds (inductor caches it on disk for later runs)."""
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    tasks = [Task("t", f"t/{i}", f"{i}+{i * 7}=", "0") for i in range(4)]
    samples = Policy(model, tok).sample(tasks, 4, GenParams(8), torch.Generator().manual_seed(0))
    runs = {}
    for compiled in (False, True):
        learner, trained = _learner(tiny_model_dir, compiled)
        batch = learner.build_batch(samples, 0.0)
        batch.advantages = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])
        losses = [learner.update(batch, 0.0, torch.Generator().manual_seed(0)).loss]
        runs[compiled] = losses, {k: p.detach().clone() for k, p in trained.named_parameters()}
    assert fastlm.compiled_blocks.cache_info().currsize >= 1  # the compiled arm did compile
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-5) and runs[False][0][0] != 0
    for k, p in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][k], p, rtol=0, atol=1e-5, msg=k)


def test_train_compile_where_it_cannot_run_is_one_line_error(tiny_model_dir, monkeypatch):
    with pytest.raises(UserError, match="fused forward") as err:  # gradient checkpointing: HF's forward
        _learner(tiny_model_dir, True, gradient_checkpointing=True)
    assert "\n" not in str(err.value) and str(err.value).startswith("train.compile: ")
    monkeypatch.setattr(fastlm.shutil, "which", lambda name: None)  # a machine without a C++ compiler
    with pytest.raises(UserError, match="C\\+\\+ compiler") as err:
        _learner(tiny_model_dir, True)
    assert "\n" not in str(err.value)
    _learner(tiny_model_dir, False)  # off, nothing is asked of the machine
