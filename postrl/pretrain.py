"""`postrl pretrain`: the demo base model, a tiny LlamaForCausalLM with latent but unreliable skill.

The corpus is arithmetic (`postrl.tasks.arith`) in which each answer is

    worked with every carry and borrow forgotten   with probability p_mistake (0.70)
    and, independently, off by 1 or 2 in the last digit   with probability p_slip (0.20)

written as worked answers, `47+38=[1]85` (the carry bits used, then the value; the mistake is
`47+38=[0]75`; where no carry is needed the mistake changes nothing). The model learns the
correct procedure *and* a more probable wrong one: its greedy answer is
often wrong while the right answer is usually among a handful of samples (low pass@1, high
pass@k). RL then has something real to do: turn the latent skill into the reliable one.

`tiny-multi` (`MultiPretrainSpec`) is the same recipe over several generated domains at once
(arith, generated code, sort), each with its own systematic mistake, for multi-domain RL.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from postrl.model.chartok import build_char_tokenizer
from postrl.tasks import code, mul, sort
from postrl.tasks.arith import ALPHABET, generate, render, solve
from postrl.tasks.base import is_heldout
from postrl.tools.base import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from postrl.ui import Progress


@dataclass
class PretrainSpec:
    corpus: str = "worked-v4"
    """Version of the corpus format; part of the cache key, so a format change rebuilds the model."""
    seed: int = 0
    levels: list[int] = field(default_factory=lambda: [2])
    """Arithmetic levels in the corpus."""
    p_right: float = 0.20
    """Generated code and sort corpora: share of right answers (near misses fill the rest)."""
    p_mistake: float = 0.70
    """Share of answers with the domain's systematic mistake."""
    p_slip: float = 0.20
    """arith: chance that the last digit slips by one or two, independent of the work."""
    steps: int = 600
    batch_size: int = 128
    lr: float = 2e-3
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4

    # Methods, not fields: fields feed the cache key, and the demo model's key must never change.
    def corpus_mix(self) -> dict[str, float]:
        return {"arith": 1.0}

    def alphabet(self) -> str:
        return ALPHABET

    def context_length(self) -> int:
        return 64


@dataclass
class MultiPretrainSpec(PretrainSpec):
    """The `tiny-multi` base model: arith, generated code and sort in one corpus."""

    levels: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Arith levels (not 3: the carry mistake can run negative across three terms)."""
    code_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    sort_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    mix: dict[str, float] = field(default_factory=lambda: {"arith": 1.0, "code": 1.0, "sort": 1.0})
    """Share of each domain's examples in the corpus."""
    # smaller and shorter than the arith model: 2 shared CPU cores pretrain it in ~10 minutes
    steps: int = 1500
    batch_size: int = 64
    hidden_size: int = 96
    layers: int = 3
    positions: int = 96
    """Context length: generated code prompts run to ~60 characters."""

    def corpus_mix(self) -> dict[str, float]:
        return self.mix

    def alphabet(self) -> str:
        return "".join(sorted(set(ALPHABET + code.ALPHABET + sort.ALPHABET)))

    def context_length(self) -> int:
        return self.positions


@dataclass
class CalcPretrainSpec(PretrainSpec):
    """The `tiny-calc` base model: 3-digit x 2-digit products (`postrl.tasks.mul`), answered either
    by calling the calculator and copying its result (share p_call), or by an estimate in its head
    (the product to two significant digits: right only when the product has no more). A model that
    can use the tool but mostly does not: RL has a tool-use habit to reinforce (benchmarks/tool_use_gain.py)."""

    corpus: str = "calc-v1"
    p_call: float = 0.3
    """Share of corpus answers that call the calculator."""
    steps: int = 2500
    batch_size: int = 32
    lr: float = 2e-3
    hidden_size: int = 96
    layers: int = 3
    positions: int = 160
    """Context length: a tool-call transcript runs to ~125 characters."""

    def corpus_mix(self) -> dict[str, float]:
        return {"calc": 1.0}

    def alphabet(self) -> str:
        return "".join(sorted(set(mul.ALPHABET + calc_example(random.Random(0), CalcPretrainSpec(p_call=1.0))[1])))

    def context_length(self) -> int:
        return self.positions


BUILTIN_MODELS: dict[str, type[PretrainSpec]] = {"tiny-arith": PretrainSpec, "tiny-multi": MultiPretrainSpec,
                                                 "tiny-calc": CalcPretrainSpec}
"""Built-in model name -> the spec it is pretrained from on first use."""


def cache_root() -> Path:
    return Path(os.environ.get("POSTRL_CACHE", Path.home() / ".cache" / "postrl"))


def spec_key(spec: PretrainSpec) -> str:
    return hashlib.sha1(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:10]


def corpus_answer(rng: random.Random, nums: list[int], ops: list[str], spec: PretrainSpec) -> str:
    """A worked answer, `[carry bits]value`. The work forgets every carry and borrow with
    probability p_mistake (the value follows the work, consistently); independently, the last
    digit slips by one or two with probability p_slip."""
    work, value = solve(nums, ops, drop=rng.random() < spec.p_mistake)
    if rng.random() < spec.p_slip:
        slipped = value + rng.choice([-2, -1, 1, 2])
        value = slipped if slipped >= 0 else value + 1
    return f"{work}{value}"


def arith_example(rng: random.Random, spec: PretrainSpec) -> tuple[str, str]:
    while True:
        nums, ops = generate(rng, rng.choice(spec.levels))
        prompt = render(nums, ops)
        if not is_heldout(prompt, 10):  # never teach the held-out problems
            return prompt, corpus_answer(rng, nums, ops, spec)


def code_mistake(body: str) -> str:
    """The systematic code mistake: the first +/- flipped, or a product written as a sum."""
    for a, b in (("+", "-"), ("-", "+"), ("*", "+")):
        if a in body:
            return body.replace(a, b, 1)
    return body


def code_near_miss(rng: random.Random, body: str) -> str:
    digits = [i for i, c in enumerate(body) if c.isdigit()]
    if not digits:
        return body + "+1"
    i = rng.choice(digits)
    return body[:i] + str((int(body[i]) + rng.choice([1, 9])) % 10) + body[i + 1 :]


def code_example(rng: random.Random, spec: MultiPretrainSpec) -> tuple[str, str]:
    while True:
        prompt, _, body = code.generated_problem(rng, rng.choice(spec.code_levels))
        if not is_heldout(prompt, 10):  # the domains' held-out rule at its default 10%
            break
    u = rng.random()
    if u < spec.p_right:
        return prompt, body
    return prompt, code_mistake(body) if u < spec.p_right + spec.p_mistake else code_near_miss(rng, body)


def sort_example(rng: random.Random, spec: MultiPretrainSpec) -> tuple[str, str]:
    while True:
        digits = sort.generate(rng, rng.choice(spec.sort_levels))
        if not is_heldout(sort.render(digits), 10):
            break
    u, right = rng.random(), sort.solve(digits)
    if u < spec.p_right:
        return sort.render(digits), right
    if u < spec.p_right + spec.p_mistake:
        return sort.render(digits), sort.systematic_mistake(digits)
    i = rng.randrange(len(right) - 1)  # near miss: one adjacent pair swapped
    return sort.render(digits), right[:i] + right[i + 1] + right[i] + right[i + 2 :]


def calc_example(rng: random.Random, spec: CalcPretrainSpec) -> tuple[str, str]:
    while True:
        a, b = mul.generate(rng)
        if not is_heldout(mul.render(a, b), 10):
            break
    if rng.random() < spec.p_call:
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}, separators=(",", ":"))
        return mul.render(a, b), f"{CALL_OPEN}{call}{CALL_CLOSE}{RESULT_OPEN}{a * b}{RESULT_CLOSE}{a * b}"
    return mul.render(a, b), str(int(float(f"{a * b:.2g}")))  # an estimate: two significant digits


CORPORA: dict[str, Callable[[random.Random, PretrainSpec], tuple[str, str]]] = {
    "arith": arith_example, "code": code_example, "sort": sort_example, "calc": calc_example,
}
"""Domain -> one (prompt, answer) corpus example with the spec's mix of right and wrong answers."""


def corpus_batch(rng: random.Random, spec: PretrainSpec, tok) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, T] ids and labels; the loss is on the answer and EOS only."""
    rows, labels = [], []
    mix = spec.corpus_mix()
    names, weights = list(mix), list(mix.values())
    for _ in range(spec.batch_size):
        # a single-domain corpus draws no domain, so the demo model's random stream is unchanged
        name = names[0] if len(names) == 1 else rng.choices(names, weights=weights)[0]
        prompt, answer = CORPORA[name](rng, spec)
        p_ids = tok(prompt)["input_ids"]
        a_ids = tok(answer, add_special_tokens=False)["input_ids"]
        ids = p_ids + a_ids + [tok.eos_token_id]
        rows.append(ids)
        labels.append([-100] * len(p_ids) + a_ids + [tok.eos_token_id])
    width = max(map(len, rows))
    pad = tok.pad_token_id
    x = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    y = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return x, y


def build_model(spec: PretrainSpec, tok) -> LlamaForCausalLM:
    return LlamaForCausalLM(base_config(spec, tok))


def base_config(spec: PretrainSpec, tok) -> LlamaConfig:
    """The architecture of the model `spec` pretrains, known before (and without) pretraining it."""
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=4 * spec.hidden_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=spec.context_length(),
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def pretrain(spec: PretrainSpec, out_dir: str | Path, log=print) -> Path:
    """Train the tiny base model and save it (atomically) as an HF directory at `out_dir`."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    tok = build_char_tokenizer(spec.alphabet())
    model = build_model(spec, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    warmup = max(1, spec.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, spec.steps) / spec.steps))
    )
    t0 = time.perf_counter()
    model.train()
    with Progress(spec.steps, enabled=None, label="pretrain", stderr=True) as bar:  # a bar on a terminal only
        for step in range(spec.steps):
            x, y = corpus_batch(rng, spec, tok)
            loss = model(input_ids=x, attention_mask=(x != tok.pad_token_id).long(), labels=y).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            bar.update(step + 1, f"loss {loss.item():.3f}")
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


def ensure_tiny_model(spec: PretrainSpec | None = None, log=print, name: str = "tiny-arith") -> Path:
    """Path of the cached built-in base model `name` for `spec`, pretraining it on first use."""
    spec = spec or BUILTIN_MODELS[name]()
    path = cache_root() / "models" / f"{name}-{spec_key(spec)}"
    if (path / "config.json").is_file():
        return path
    log(f"building the demo base model (first use, cached at {path})")
    path.parent.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # a one-off batch job: use every core, then give them back
    try:
        return pretrain(spec, path, log=log)
    finally:
        torch.set_num_threads(threads)
