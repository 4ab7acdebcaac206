"""Peak memory and tokens/s of one policy-gradient update of SmolLM2-135M with LoRA on one long
sequence: postrl's update against the same loss written as a user first would.

    .venv/bin/python benchmarks/long_context_memory.py                       # 1k, 2k, 4k, 8k + 2k generation
    .venv/bin/python benchmarks/long_context_memory.py --lengths 128,256 --gen-tokens 64   # a quick look

Arms, each one update of one sequence of L tokens (64 prompt + L-64 completion, random ids from a
fixed seed; advantage 1, behaviour log-probs 0), float32 weights, LoRA r=16 on every projection:
  postrl  `Learner.update`: gradient checkpointing, the vocabulary head in 16 MiB chunks
          (recomputed in the backward), sequence packing, micro-batch of one completion;
  naive   the model's own Hugging Face forward with its default attention (SDPA), the same LoRA,
          the full [L, V] logits and a full log-softmax over the vocabulary, the same clipped
          policy-gradient loss, no gradient checkpointing, an AdamW step.
  generate (with --gen-tokens) postrl's fast engine sampling that many new tokens after a short
          prompt (no LoRA: FastLM's static KV cache; EOS ignored so every token is generated).

Each arm runs in a subprocess of its own; its peak memory is that process's maximum resident set
(`wait4`'s ru_maxrss, model loading included). Every arm runs with MALLOC_MMAP_THRESHOLD_=65536:
with glibc's default (a threshold that rises to 32 MiB after the first large free) the tensors
of a long forward/backward are carved from heap arenas that keep freed memory, so the resident
set measures the allocator's high-water mark, not the memory the computation holds (measured:
postrl's 2k-token update peaks at 3.51 GiB that way, 1.21 GiB with the threshold fixed).
`--glibc-default` runs without it. While it runs its resident memory is polled, and
past `--limit-gib` it is killed and reported as killed for memory, as is one the kernel kills.
The last lines: every arm's peak (`arm@length=GiB`, `killed>LIMIT` when killed), then
`RESULT peak_ratio@LENGTH=naive/postrl target=3` at the longest length both arms ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _harness import Bench, load_avg, parser  # benchmarks/, on the path when this script runs

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
PROMPT_TOKENS = 64
LORA = {"r": 16, "alpha": 32.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                    "up_proj", "down_proj"]}


# ---------------------------------------------------------------------------- the arms (children)


def _load(lora: bool):
    import torch

    from postrl.config.schema import LoraConfig
    from postrl.model.load import load_model
    from postrl.model.lora import apply_lora

    model, tok = load_model(MODEL, log=lambda *_: None)
    if lora:
        torch.manual_seed(0)
        model = apply_lora(model, LoraConfig(**LORA))
    return model, tok


def _sequence(length: int, vocab: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    return torch.randint(100, vocab, (1, length), generator=gen)


def arm_postrl(length: int) -> dict:
    import torch

    from postrl.config.schema import ModelConfig, RLConfig, TrainConfig
    from postrl.learner.learner import Learner
    from postrl.records import Batch
    from postrl.sampling.policy import Policy

    model, tok = _load(lora=True)
    ids = _sequence(length, model.config.vocab_size)
    train = TrainConfig(minibatches=1, samples_per_prompt=1, pack_sequences=True, max_tokens_per_microbatch=length)
    learner = Learner(Policy(model, tok), None, train, RLConfig(kl_coef=0.0),
                      ModelConfig(gradient_checkpointing=True, micro_batch_size=1))
    loss_mask = torch.zeros(1, length - 1)
    loss_mask[0, PROMPT_TOKENS - 1 :] = 1
    # a batch made here, not by build_batch: one synthetic completion, no reward to group
    batch = Batch(ids, torch.ones_like(ids), loss_mask, torch.zeros(1, length - 1), None, torch.ones(1),
                  torch.ones(1))
    t0 = time.perf_counter()
    learner.update(batch, 0.0, torch.Generator().manual_seed(0))
    return {"update_s": time.perf_counter() - t0}


def arm_naive(length: int) -> dict:
    import torch

    model, _ = _load(lora=True)
    ids = _sequence(length, model.config.vocab_size)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    t0 = time.perf_counter()
    logits = model(input_ids=ids).logits[:, :-1]  # [1, L-1, V]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = torch.zeros_like(logp)
    mask[0, PROMPT_TOKENS - 1 :] = 1
    ratio = torch.exp(logp)  # behaviour log-probs 0, advantage 1, as in the postrl arm
    loss = -(torch.minimum(ratio, ratio.clamp(0.8, 1.28)) * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {"update_s": time.perf_counter() - t0}


def arm_generate(new_tokens: int) -> dict:
    import torch

    from postrl.sampling.generate import GenParams, generate

    model, tok = _load(lora=False)
    prompt = tok("Write a long story about a lighthouse keeper.")["input_ids"]
    t0 = time.perf_counter()
    out = generate(model, [prompt], GenParams(new_tokens, temperature=0.7), eos_id=-1, pad_id=tok.pad_token_id,
                   generator=torch.Generator().manual_seed(0))
    return {"gen_s": time.perf_counter() - t0, "tokens": len(out[0].token_ids)}


def child(arm: str, n: int, threads: int) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
    result = {"postrl": arm_postrl, "naive": arm_naive, "generate": arm_generate}[arm](n)
    print("ARM " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------- the parent


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


MALLOC: dict[str, str] = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""Allocator setting of every arm (cleared by --glibc-default): see the module docstring."""


def run_arm(arm: str, n: int, limit_gib: float, threads: int) -> dict:
    """One arm in its own process: {'peak_gib', 'killed', ...the arm's own numbers}."""
    import tempfile

    cmd = [sys.executable, __file__, "--child", arm, "--n", str(n), "--threads", str(threads)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **MALLOC}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        killed = None
        while True:  # wait4, not Popen.wait: it reports this child's own peak resident memory
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if killed is None and _rss_bytes(proc.pid) > limit_gib * 2**30:
                os.kill(proc.pid, signal.SIGKILL)
                killed = f"killed: resident memory passed --limit-gib {limit_gib:g}"
            time.sleep(0.05)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if killed is None and code == -signal.SIGKILL:
        killed = "killed: SIGKILL from outside (the kernel's out-of-memory killer?)"
    line = next((x for x in stdout.splitlines()[::-1] if x.startswith("ARM ")), None)
    if killed is None and line is None:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        killed = f"failed (exit {code}): {last}"
    return {"peak_gib": usage.ru_maxrss * 1024 / 2**30, "killed": killed, **(json.loads(line[4:]) if line else {})}


def _headline(rows: list[dict]) -> tuple[str, str]:
    """(metric, value): naive / postrl peak memory at the longest length both arms ran ('>' when
    naive was killed)."""
    both = [r for r in rows if "postrl" in r and "naive" in r]
    if not both:
        return "peak_ratio", "none"
    r = both[-1]
    naive, postrl = r["naive"], r["postrl"]
    if naive["killed"]:
        return f"peak_ratio@{r['length']}", f">{naive['limit'] / postrl['peak_gib']:.1f}"
    return f"peak_ratio@{r['length']}", f"{naive['peak_gib'] / postrl['peak_gib']:.1f}"


def _fmt(r: dict) -> str:
    return f"killed>{r['limit']:g}" if r["killed"] else f"{r['peak_gib']:.2f}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--lengths", default="1024,2048,4096,8192", help="tokens per sequence, comma-separated")
    ap.add_argument("--arms", default="postrl,naive")
    ap.add_argument("--gen-tokens", type=int, default=2048, help="new tokens of the generation arm (0 = skip)")
    ap.add_argument("--limit-gib", type=float, default=12.0, help="an arm past this resident memory is killed")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per arm (0 = torch's default)")
    ap.add_argument("--glibc-default", action="store_true", help="keep glibc's dynamic mmap threshold")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.n, args.threads)
    bench = Bench(__file__, args)
    if args.glibc_default:
        MALLOC.clear()
    print(f"SmolLM2-135M + LoRA r=16, one update of one sequence; {os.cpu_count()} cores; "
          f"limit {args.limit_gib:g} GiB per arm; load average {load_avg():.2f}; "
          f"allocator {MALLOC or 'glibc default'}", flush=True)
    rows, result = [], []
    for n in [int(x) for x in args.lengths.split(",") if x]:  # --lengths '' runs the generation arm only
        row = {"length": n}
        for arm in args.arms.split(","):
            r = {**run_arm(arm, n, args.limit_gib, args.threads), "limit": args.limit_gib}
            row[arm] = r
            result.append(f"{arm}@{n}={_fmt(r)}")
            speed = "" if r["killed"] else f", {n / r['update_s']:.0f} tokens/s ({r['update_s']:.1f} s)"
            print(f"  {arm:>7} L={n:>5}: peak {r['peak_gib']:.2f} GiB{speed}" + (f"  [{r['killed']}]" if r["killed"] else ""),
                  flush=True)
        rows.append(row)
    if rows:
        _table(rows, args.arms.split(","), args.limit_gib)
    if args.gen_tokens:
        g = {**run_arm("generate", args.gen_tokens, args.limit_gib, args.threads), "limit": args.limit_gib}
        if g["killed"]:
            print(f"generate {args.gen_tokens}: {g['killed']}")
        else:
            print(f"generate {g['tokens']} new tokens (fast engine, batch 1): {g['tokens'] / g['gen_s']:.1f} tokens/s, "
                  f"peak {g['peak_gib']:.2f} GiB")
            result.append(f"gen{g['tokens']}_tok_s={g['tokens'] / g['gen_s']:.1f} gen_peak={g['peak_gib']:.2f}")
    print(f"total {bench.clock.seconds:.0f}s")
    print("arms (GiB): " + " ".join(result))
    bench.result(*_headline(rows), target=3)


def _table(rows: list[dict], arms: list[str], limit: float) -> None:
    print("\n| tokens | " + " | ".join(f"{a} peak GiB | {a} tokens/s" for a in arms) + " | naive / postrl |")
    print("|---|" + "---|---|" * len(arms) + "---|")
    for row in rows:
        cells = []
        for a in arms:
            r = row[a]
            cells += [f"> {limit:g} (killed)" if r["killed"] else f"{r['peak_gib']:.2f}",
                      "-" if r["killed"] else f"{row['length'] / r['update_s']:.0f}"]
        ratio = ""
        if "postrl" in row and "naive" in row and not row["postrl"]["killed"]:
            p, q = row["postrl"]["peak_gib"], row["naive"]
            ratio = f"> {limit / p:.1f}x" if q["killed"] else f"{q['peak_gib'] / p:.1f}x"
        print(f"| {row['length']} | " + " | ".join(cells) + f" | {ratio} |")
    print()


if __name__ == "__main__":
    main()
