"""`postrl pretrain`: the demo base model, a tiny LlamaForCausalLM with latent but unreliable skill.

The corpus is arithmetic (`postrl.tasks.arith`) in which each answer is

    right                    with probability p_right      (0.30)
    the systematic mistake   with probability p_mistake    (0.55)  every carry/borrow decision inverted
    a near miss (+-1, +-2)   otherwise                     (0.15)

so the model learns the correct procedure *and* a more probable wrong one: its greedy answer is
often wrong while the right answer is usually among a handful of samples (low pass@1, high
pass@k). RL then has something real to do: turn the latent skill into the reliable one.

Deterministic from `seed`; the result is a standard Hugging Face model directory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from postrl.policy.chartok import build_char_tokenizer
from postrl.tasks.arith import ALPHABET, evaluate, generate, is_heldout, render, systematic_mistake


@dataclass
class PretrainSpec:
    seed: int = 0
    levels: list[int] = field(default_factory=lambda: [2])
    """Arithmetic levels in the corpus."""
    p_right: float = 0.30
    p_mistake: float = 0.55
    steps: int = 1200
    batch_size: int = 128
    lr: float = 2e-3
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4


def cache_root() -> Path:
    return Path(os.environ.get("POSTRL_CACHE", Path.home() / ".cache" / "postrl"))


def spec_key(spec: PretrainSpec) -> str:
    return hashlib.sha1(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:10]


def corpus_answer(rng: random.Random, nums: list[int], ops: list[str], spec: PretrainSpec) -> int:
    right = evaluate(nums, ops)
    u = rng.random()
    if u < spec.p_right:
        return right
    if u < spec.p_right + spec.p_mistake:
        return systematic_mistake(nums, ops)
    near = right + rng.choice([-2, -1, 1, 2])
    return near if near >= 0 else right + 1


def corpus_batch(rng: random.Random, spec: PretrainSpec, tok) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] ids and labels; the loss is on the answer and EOS only."""
    rows, labels = [], []
    for _ in range(spec.batch_size):
        while True:
            nums, ops = generate(rng, rng.choice(spec.levels))
            prompt = render(nums, ops)
            if not is_heldout(prompt, 10):  # never teach the held-out problems
                break
        p_ids = tok(prompt)["input_ids"]
        a_ids = tok(str(corpus_answer(rng, nums, ops, spec)), add_special_tokens=False)["input_ids"]
        ids = p_ids + a_ids + [tok.eos_token_id]
        rows.append(ids)
        labels.append([-100] * len(p_ids) + a_ids + [tok.eos_token_id])
    width = max(map(len, rows))
    pad = tok.pad_token_id
    x = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    y = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return x, y


def build_model(spec: PretrainSpec, tok) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=4 * spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(config)


def pretrain(spec: PretrainSpec, out_dir: str | Path, log=print) -> Path:
    """Train the tiny base model and save it (atomically) as an HF directory at `out_dir`."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(spec, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    warmup = max(1, spec.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, spec.steps) / spec.steps))
    )
    t0 = time.perf_counter()
    model.train()
    for step in range(spec.steps):
        x, y = corpus_batch(rng, spec, tok)
        loss = model(input_ids=x, attention_mask=(x != tok.pad_token_id).long(), labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == spec.steps - 1:
            log(f"pretrain step {step:5d}/{spec.steps}  loss {loss.item():.3f}  {time.perf_counter() - t0:.0f}s")
    out = Path(out_dir)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "postrl_pretrain.json").write_text(json.dumps(asdict(spec), indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def ensure_tiny_model(spec: PretrainSpec | None = None, log=print) -> Path:
    """Path of the cached demo base model for `spec`, pretraining it on first use."""
    spec = spec or PretrainSpec()
    path = cache_root() / "models" / f"tiny-arith-{spec_key(spec)}"
    if (path / "config.json").is_file():
        return path
    log(f"building the demo base model (first use, cached at {path})")
    path.parent.mkdir(parents=True, exist_ok=True)
    return pretrain(spec, path, log=log)
