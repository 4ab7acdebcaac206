"""postrl's sampler vs transformers' `model.generate`, and both halves of a step against the
machine's matmul peak, measured in one run.

    .venv/bin/python benchmarks/rollout_speed.py [--model tiny-arith] [--batch 256] [--new-tokens 8] [--threads 1]

- Sampling: the same `--batch` prompts (all distinct, and as in a training step: groups of
  `samples_per_prompt` rows sharing a prompt; RESULT is the latter), `--new-tokens` tokens each (EOS never ends a
  row in either arm, so both produce batch x new-tokens tokens), temperature 1, the two arms
  interleaved `--repeats` times and the fastest run of each kept (the machine is shared).
- Peak: the best fp32 matmul FLOP/s torch reaches here at the same thread count.
- Achieved model FLOP/s: 2 x matmul parameters per token forward (plus attention's 4 x layers x
  context x width), 3x that for forward+backward. Counted per row as MFU usually is; postrl
  computes a shared prompt once, so the hardware does less work than that count (also shown).
"""

from __future__ import annotations

import argparse
import time

import torch

from postrl.builtin_models import load_model, resolve_model_path
from postrl.config.loading import load_config
from postrl.curriculum.sampler import TaskSampler
from postrl.engines.orders import attach_scores, reward_terms, score_chunk
from postrl.learner.learner import Learner
from postrl.model.fastlm import shared_prefixes
from postrl.model.lora import make_reference
from postrl.sampling.generate import GenParams, generate, left_pad
from postrl.sampling.policy import Policy
from postrl.seeding import step_generator
from postrl.tasks.catalog import build_domains


def matmul_peak(seconds: float = 3.0) -> float:
    """Best fp32 FLOP/s over a few square sizes."""
    best = 0.0
    for n in (256, 512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        end = time.perf_counter() + seconds / 4
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def flops_per_token(model, context: float) -> float:
    """Forward FLOPs of one token: 2 per matmul weight (embedding lookup excluded, head included)."""
    cfg = model.config
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n)
    if getattr(cfg, "tie_word_embeddings", False):
        matmul += model.get_output_embeddings().weight.numel()
    width = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return 2 * matmul + 4 * cfg.num_hidden_layers * context * width


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sampling(model, tok, prompts, new_tokens: int, repeats: int) -> dict[str, float]:
    params = GenParams(new_tokens, temperature=1.0)
    ids, mask = left_pad(prompts, tok.pad_token_id)

    def ours():
        generate(model, prompts, params, eos_id=-1, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))

    def theirs():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)

    ours(), theirs()  # warm-up
    t_ours, t_theirs = float("inf"), float("inf")
    for _ in range(repeats):  # interleaved, so both arms see the same load
        t_ours = min(t_ours, best_of(ours, 1))
        t_theirs = min(t_theirs, best_of(theirs, 1))
    n_tokens = len(prompts) * new_tokens
    prompt_tokens = sum(map(len, prompts))
    context = sum(map(len, prompts)) / len(prompts) + new_tokens / 2
    flops = flops_per_token(model, context) * (prompt_tokens + n_tokens)
    return {"postrl_s": t_ours, "hf_s": t_theirs, "tokens": n_tokens, "flops": flops}


def update(model_path, recipe: str, overrides: list[str], repeats: int) -> dict[str, float]:
    """Seconds of one step's learner work (reference log-probs + ppo_epochs x minibatches updates)."""
    cfg = load_config(recipe, [f"model.name={model_path}", *overrides])
    domains = build_domains(cfg)
    model, tok = load_model(str(model_path), log=lambda *a: None)
    policy = Policy(model, tok)
    learner = Learner(policy, make_reference(model), cfg.train, cfg.rl)
    weights = {name: d.weight for name, d in cfg.domains.items()}
    tasks = TaskSampler(domains, cfg.seed).next_batch(cfg.train.prompts_per_step, weights)
    gen = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
    samples = policy.sample(tasks, cfg.train.samples_per_prompt, gen, step_generator(cfg.seed, 0, 0))
    attach_scores(samples, score_chunk(samples, domains, reward_terms(cfg)))

    def step():
        batch = learner.build_batch(samples, cfg.rl.kl_coef)
        learner.update(batch, cfg.rl.kl_coef, step_generator(cfg.seed, 0, 1))

    step()  # warm-up
    seconds = best_of(step, repeats)
    batch = learner.build_batch(samples, cfg.rl.kl_coef)
    rows = int(batch.attention_mask.sum())
    distinct = len(shared_prefixes(batch.input_ids, batch.attention_mask).owner)
    per_token = flops_per_token(model, rows / len(samples) / 2)
    flops = per_token * rows * (1 + 3 * cfg.train.ppo_epochs)  # reference forward + policy forward/backward
    return {"s": seconds, "flops": flops, "rows_tokens": rows, "distinct_tokens": distinct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    path = resolve_model_path(a.model)
    model, tok = load_model(str(path), log=lambda *x: None)
    cfg = load_config(a.recipe, [f"model.name={path}", *a.overrides])
    weights = {name: d.weight for name, d in cfg.domains.items()}
    tasks = TaskSampler(build_domains(cfg), cfg.seed).next_batch(a.batch, weights)
    encode = Policy(model, tok).encode_prompt
    group = cfg.train.samples_per_prompt
    layouts = {  # distinct problems (no sharing possible) and a training step's layout (groups share a prompt)
        "distinct prompts": [encode(t.prompt) for t in tasks],
        f"{a.batch // group} prompts x {group}": [encode(t.prompt) for t in tasks[: a.batch // group] for _ in range(group)],
    }
    peak = matmul_peak()
    runs = {name: sampling(model, tok, prompts, a.new_tokens, a.repeats) for name, prompts in layouts.items()}
    u = update(path, a.recipe, a.overrides, a.repeats)
    print(f"model {path}; torch threads={a.threads}; batch {a.batch} x {a.new_tokens} new tokens; "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'':42s} {'seconds':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'of peak':>8s}")
    for layout, s in runs.items():
        for name, sec in (("postrl generate", s["postrl_s"]), ("transformers generate", s["hf_s"])):
            print(f"{name + ', ' + layout:42s} {sec:8.3f} {s['tokens'] / sec:9.0f} {s['flops'] / sec / 1e9:8.2f} "
                  f"{s['flops'] / sec / peak:8.1%}")
        print(f"{'  ratio postrl/transformers':42s} {s['hf_s'] / s['postrl_s']:8.2f}x")
    print(f"{'postrl update step (ref fwd + fwd/bwd/opt)':42s} {u['s']:8.3f} {u['rows_tokens'] / u['s']:9.0f} {u['flops'] / u['s'] / 1e9:8.2f} "
          f"{u['flops'] / u['s'] / peak:8.1%}   ({u['rows_tokens']} row tokens, {u['distinct_tokens']} distinct "
          f"prefixes actually computed: hardware does {u['distinct_tokens'] / u['rows_tokens']:.0%} of the counted work)")
    step_layout = runs[list(layouts)[1]]
    print(f"RESULT sampling_tokens_per_s_ratio={step_layout['hf_s'] / step_layout['postrl_s']:.2f} target=2")


if __name__ == "__main__":
    main()
