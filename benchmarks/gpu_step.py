"""One RL step on one accelerator: sampling and update tokens/s, utilisation against the device's
bf16 matmul peak, postrl's engine against `model.generate`, and the learner/sampler log-prob mismatch.

    python benchmarks/gpu_step.py                         # cuda, bf16, SmolLM2-135M and Qwen2.5-0.5B shapes
    python benchmarks/gpu_step.py --device cpu --small    # tiny shapes, float32: a smoke run on any machine

The models are random-initialised from their architectures' configs (written out below: nothing is
downloaded). This file imports only torch, transformers and postrl's policy package
(`postrl.sampling.generate`, `.logprobs`, `.precision`), which import nothing else of postrl
(tests/test_long_context.py checks it), so it runs on a machine that has its own torch and
transformers and no package index: copy the repository, run it.

Per model, one RL step on `--batch` prompts of `--prompt-tokens` random tokens:
  - peak: the best bf16 (float32 with --small on cpu) matmul FLOP/s of this device, measured first;
  - sample: postrl's engine (`generate`, FastLM with its static KV cache), `--new-tokens` per row, EOS
    ignored, temperature 1; the same batch through `model.generate(do_sample=True)`;
  - mismatch: max |learner log-prob - sampler log-prob| over the sampled tokens, the learner's
    recomputed by `token_logprobs` on the same weights (no train/inference engine split to correct);
  - update: the clipped policy-gradient loss on every sampled token, backward, AdamW step (float32
    master weights under bf16), timed; utilisation counts 2 FLOPs per matmul weight per token
    forward (6 forward+backward) plus attention, against the measured peak.
The last line is `RESULT ...`.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from postrl.learner.precision import make_optimizer
from postrl.model.logprobs import token_logprobs
from postrl.sampling.generate import GenParams, generate

ARCHITECTURES = {  # the published configs' shapes (HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B)
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True, hidden_act="silu")),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False)),
}
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, seconds: float = 2.0) -> float:
    """Best FLOP/s of an n x n x n matmul in `dtype` on `device`."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        best = max(best, 10 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def build(name: str, small: bool, device: torch.device, dtype: torch.dtype, small_shape: dict = SMALL):
    """Architecture `name` with random weights (seed 0); `small`: with `small_shape`'s sizes."""
    config_cls, model_cls, shape = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**shape, **(small_shape if small else {})}))
    return model.to(device=device, dtype=dtype).eval()


def flops_per_token(model, context: int) -> float:
    """Forward FLOPs per token: 2 per matmul weight (the head included) plus attention's
    4 x layers x context x width (scores and values; a causal average context)."""
    cfg = model.config
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 2 * weights + 4 * cfg.num_hidden_layers * context * cfg.num_attention_heads * (cfg.hidden_size //
                                                                                          cfg.num_attention_heads)


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def sample_both(model, prompts: torch.Tensor, new: int, device) -> dict:
    """postrl's engine and model.generate on the same prompts; warmed up first."""
    rows = prompts.tolist()
    gen = torch.Generator().manual_seed(0)

    def ours(n):
        return generate(model, rows, GenParams(n, temperature=1.0), eos_id=-1, pad_id=0, generator=gen)

    def theirs(n):
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                              top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)

    ours(2), theirs(2)  # warm-up: kernels, allocator
    gens, ours_s = timed(device, lambda: ours(new))
    _, theirs_s = timed(device, lambda: theirs(new))
    tokens = len(rows) * new
    return {"gens": gens, "sample_tok_s": tokens / ours_s, "hf_generate_tok_s": tokens / theirs_s}


def rl_update(model, prompts: torch.Tensor, gens, device) -> dict:
    """Mismatch of the learner's log-probs against the sampler's, then one timed update."""
    p = prompts.shape[1]
    ids = torch.tensor([row + g.token_ids for row, g in zip(prompts.tolist(), gens)], device=device)
    attn = torch.ones_like(ids)
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=device)
    mask[:, p - 1 :] = 1
    old = torch.zeros_like(mask)
    old[:, p - 1 :] = torch.tensor([g.logprobs for g in gens], device=device)
    temps = torch.ones(ids.shape[0], device=device)
    with torch.no_grad():
        learner, _ = token_logprobs(model, ids, attn, temps, needed=mask)
    mismatch = ((learner - old).abs() * mask).max().item()
    adv = torch.where(torch.arange(ids.shape[0], device=device) % 2 == 0, 1.0, -1.0)
    opt = make_optimizer([q for q in model.parameters() if q.requires_grad], lr=1e-5, weight_decay=0.0)
    model.train()

    def step():
        logp, _ = token_logprobs(model, ids, attn, temps, needed=mask)
        ratio = torch.exp(logp - old)
        surrogate = torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.28) * adv[:, None])
        loss = -(surrogate * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    _, seconds = timed(device, step)
    model.eval()
    return {"mismatch_max": mismatch, "update_tok_s": ids.numel() / seconds, "update_tokens": ids.numel()}


def run_model(name: str, args, device, dtype, peak: float) -> dict:
    model = build(name, args.small, device, dtype)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, model.config.vocab_size, (args.batch, args.prompt_tokens), generator=gen).to(device)
    sampled = sample_both(model, prompts, args.new_tokens, device)
    update = rl_update(model, prompts, sampled.pop("gens"), device)
    ctx = args.prompt_tokens + args.new_tokens
    sample_util = sampled["sample_tok_s"] * flops_per_token(model, ctx) / peak
    update_util = update["update_tok_s"] * 3 * flops_per_token(model, ctx // 2) / peak
    del model
    return {**sampled, **update, "sample_util": sample_util, "update_util": update_util}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda | cpu | cuda:N")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run), float32 on the cpu")
    ap.add_argument("--models", default=",".join(ARCHITECTURES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--peak-seconds", type=float, default=2.0, help="time spent measuring the matmul peak")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here (use --device cpu --small)")
    dtype = torch.float32 if (args.small and device.type == "cpu") else torch.bfloat16
    peak = matmul_peak(device, dtype, 512 if args.small else 8192, args.peak_seconds)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}: {dtype} matmul peak {peak / 1e12:.2f} TFLOP/s; torch {torch.__version__}; batch {args.batch} x "
          f"({args.prompt_tokens} prompt + {args.new_tokens} new) tokens", flush=True)
    result = [f"peak_tflops={peak / 1e12:.2f}"]
    for model_name in args.models.split(","):
        r = run_model(model_name, args, device, dtype, peak)
        print(f"{model_name}{' (small)' if args.small else ''}: sample {r['sample_tok_s']:.0f} tok/s "
              f"({r['sample_util']:.1%} of peak) vs model.generate {r['hf_generate_tok_s']:.0f} tok/s; "
              f"update {r['update_tok_s']:.0f} tok/s ({r['update_util']:.1%}); "
              f"max |learner - sampler| log-prob {r['mismatch_max']:.2e}", flush=True)
        result.append(f"{model_name}:sample_tok_s={r['sample_tok_s']:.0f},generate_tok_s={r['hf_generate_tok_s']:.0f},"
                      f"update_tok_s={r['update_tok_s']:.0f},mismatch_max={r['mismatch_max']:.2e}")
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
