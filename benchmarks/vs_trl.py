"""postrl vs TRL's GRPOTrainer on identical work, side by side in one process.

    .venv/bin/python benchmarks/vs_trl.py [--model tiny-arith] [--budget-s 120] [--threads 1]

Both arms start from the same model directory (TRL with beta > 0 loads its reference from the
path), see the same prompts in the same order, and run the same step: `prompts_per_step` prompts
x `samples_per_prompt` completions of at most `max_new_tokens`, rewarded by the same arith
verifier, then `ppo_epochs x minibatches` optimiser steps of clipped GRPO with a k3 KL penalty
(beta = kl_coef), token-mean aggregation (TRL's loss_type="dapo"), std-scaled group advantages,
the recipe's clip range and learning rate, in float32 and with gradient checkpointing only as the recipe's
model.gradient_checkpointing says (TRL's defaults are bf16 autocast and checkpointing on). CPU only, no
vLLM; both use the same torch thread count.

Each arm trains for the same wall-clock budget; throughput comes from its steps after the first
(warm-up), and both trained models are then scored by `postrl.evaluation.evaluate_domain` on the
same held-out problems. The machine is shared, so only ratios measured in one run mean much.
Needs `pip install trl` (not a postrl dependency).
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from _harness import Bench, load_avg, parser  # benchmarks/, on the path when this script runs

from postrl.builtin_models import load_model, resolve_model_path
from postrl.config.loading import load_config
from postrl.curriculum.sampler import TaskSampler
from postrl.engines.orders import attach_scores, reward_terms, score_chunk
from postrl.evaluation import evaluate_domain
from postrl.learner.learner import Learner
from postrl.model.lora import make_reference
from postrl.records import Response
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.seeding import step_generator
from postrl.tasks.catalog import build_domains


def run_postrl(path, cfg, tasks, budget_s: float) -> tuple[list[float], int, Policy]:
    """Train until the budget is spent; (seconds per step, completion tokens after warm-up, policy)."""
    domains = build_domains(cfg)
    model, tok = load_model(str(path), log=lambda *a: None)
    policy = Policy(model, tok)
    learner = Learner(policy, make_reference(model), cfg.train, cfg.rl, cfg.model)  # model.gradient_checkpointing
    gen = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
    p, n = cfg.train.prompts_per_step, cfg.train.samples_per_prompt
    times, tokens, start, step = [], 0, time.perf_counter(), 0
    while time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        batch_tasks = tasks[(step * p) % len(tasks) :][:p]
        samples = policy.sample(batch_tasks, n, gen, step_generator(cfg.seed, step, 0))
        attach_scores(samples, score_chunk(samples, domains, reward_terms(cfg)))
        batch = learner.build_batch(samples, cfg.rl.kl_coef)
        learner.update(batch, cfg.rl.kl_coef, step_generator(cfg.seed, step, 1))
        times.append(time.perf_counter() - t0)
        tokens += sum(len(s.completion_ids) for s in samples) if step else 0
        step += 1
    return times, tokens, policy


def trl_reward(domain, by_prompt):
    """TRL reward function: the postrl verifier's reward for each completion text."""
    counted: list[int] = []  # completion tokens per generation batch

    def arith_reward(prompts, completions, completion_ids=None, **_):
        tasks = [by_prompt[p] for p in prompts]
        scores = domain.score(tasks, [Response(c, "stop") for c in completions])
        counted.append(sum(map(len, completion_ids or [])))
        return [s.reward for s in scores]

    return arith_reward, counted


def run_trl(path, cfg, tasks, budget_s: float, workdir: str):
    """Train with GRPOTrainer until the budget is spent; same return shape as run_postrl."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    domain = next(iter(build_domains(cfg).values()))
    t = cfg.train
    completions = t.prompts_per_step * t.samples_per_prompt
    reward_fn, counted = trl_reward(domain, {task.prompt: task for task in tasks})
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10**6,
        per_device_train_batch_size=completions // t.minibatches, gradient_accumulation_steps=1,
        steps_per_generation=t.minibatches, num_iterations=t.ppo_epochs, num_generations=t.samples_per_prompt,
        max_completion_length=t.max_new_tokens, temperature=t.temperature, top_p=t.top_p, top_k=0,
        beta=cfg.rl.kl_coef, epsilon=cfg.rl.clip_low, epsilon_high=cfg.rl.clip_high, loss_type="dapo",
        scale_rewards="group" if cfg.rl.scale_by_std else "none", learning_rate=t.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
        max_steps=10**6, shuffle_dataset=False, seed=cfg.seed, disable_dropout=True, dataloader_num_workers=0,
        # TRL's own defaults (GRPOConfig, 1.16.0) change the work, not only its speed: bf16=True runs every
        # matmul of sampling and update in bf16 autocast (postrl computes in float32), and
        # gradient_checkpointing=True recomputes each forward in the backward (both arms do only when the recipe
        # sets model.gradient_checkpointing). On a CPU without native bf16 (no AVX512_BF16 or AMX) the bf16
        # default alone made TRL's step about 6x slower; see docs/benchmarks.md#speed.
        bf16=False, fp16=False, gradient_checkpointing=cfg.model.gradient_checkpointing,
    )
    marks: list[float] = []
    optimiser_steps = t.minibatches * t.ppo_epochs  # per generation batch, as in postrl

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kw):
            marks.append(time.perf_counter())
            if marks[-1] - start >= budget_s and state.global_step % optimiser_steps == 0:
                control.should_training_stop = True

    data = Dataset.from_list([{"prompt": task.prompt} for task in tasks] * 50)
    trainer = GRPOTrainer(model=str(path), reward_funcs=reward_fn, args=args, train_dataset=data, callbacks=[Clock()])
    start = time.perf_counter()
    trainer.train()
    ends = [start] + marks[optimiser_steps - 1 :: optimiser_steps]
    times = [b - a for a, b in zip(ends, ends[1:])]
    _, tok = load_model(str(path), log=lambda *a: None)
    return times, sum(counted[1 : len(times)]), Policy(trainer.model.eval(), tok)


def evaluate(policy: Policy, cfg, problems: int, samples: int) -> dict[str, float]:
    domain = next(iter(build_domains(cfg).values()))
    return evaluate_domain(policy, domain, num_problems=problems, ks=[1], samples_per_problem=samples,
                           temperature=1.0, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed)


def throughput(times: list[float], tokens: int, completions_per_step: int) -> dict[str, float]:
    """Steady-state numbers from the steps after the first (warm-up)."""
    steady = times[1:] or times
    sec = statistics.median(steady)
    return {"steps": len(times), "sec_per_step": sec, "completions_per_s": completions_per_step / sec,
            "tokens_per_s": tokens / sum(steady)}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", default="tiny-arith", help="built-in name or HF model directory")
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall-clock training budget per arm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="dotted recipe overrides, e.g. train.max_new_tokens=8")
    a = ap.parse_args()
    bench = Bench(__file__, a)
    torch.set_num_threads(a.threads)
    path = resolve_model_path(a.model)  # one directory, loaded by both arms
    cfg = load_config(a.recipe, [f"model.name={path}", *a.overrides])
    cfg.rl.kl_coef = cfg.rl.kl_coef or 0.01  # KL on in both arms
    domains = build_domains(cfg)
    weights = {name: d.weight for name, d in cfg.domains.items()}
    tasks = TaskSampler(domains, cfg.seed).next_batch(cfg.train.prompts_per_step * 200, weights)
    t = cfg.train
    print(f"model {path}; {t.prompts_per_step} prompts x {t.samples_per_prompt} samples, max_new_tokens="
          f"{t.max_new_tokens}, {t.ppo_epochs}x{t.minibatches} optimiser steps/batch, kl_coef={cfg.rl.kl_coef}, "
          f"torch threads={a.threads}, budget {a.budget_s:.0f}s per arm; load average {load_avg():.2f}")
    base_model, base_tok = load_model(str(path), log=lambda *x: None)
    base = evaluate(Policy(base_model, base_tok), cfg, a.eval_problems, a.eval_samples)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name, arm in (("trl", lambda: run_trl(path, cfg, tasks, a.budget_s, work)),
                          ("postrl", lambda: run_postrl(path, cfg, tasks, a.budget_s))):
            times, tokens, policy = arm()
            results[name] = {**throughput(times, tokens, t.prompts_per_step * t.samples_per_prompt),
                             **{f"eval_{k}": v for k, v in evaluate(policy, cfg, a.eval_problems, a.eval_samples).items()
                                if k in ("greedy", "pass@1")}}
    report(results, base, a, bench)


def report(results: dict, base: dict, a, bench: Bench) -> None:
    import transformers
    import trl

    print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, load average "
          f"{load_avg():.2f}; held-out: {a.eval_problems} problems x "
          f"{a.eval_samples} samples; base model pass@1={base['pass@1']:.3f} greedy={base['greedy']:.3f}")
    print(f"{'':8s} {'steps':>6s} {'sec/step':>9s} {'compl/s':>9s} {'tokens/s':>9s} "
          f"{'pass@1 @' + str(int(a.budget_s)) + 's':>14s} {'greedy':>7s}")
    for name, r in results.items():
        print(f"{name:8s} {r['steps']:6d} {r['sec_per_step']:9.3f} {r['completions_per_s']:9.1f} "
              f"{r['tokens_per_s']:9.1f} {r['eval_pass@1']:14.3f} {r['eval_greedy']:7.3f}")
    p, q = results["postrl"], results["trl"]
    ratio = p["completions_per_s"] / q["completions_per_s"]
    print(f"ratio postrl/trl: sec/step {q['sec_per_step'] / p['sec_per_step']:.2f}x faster, "
          f"completions/s {ratio:.2f}x, tokens/s {p['tokens_per_s'] / q['tokens_per_s']:.2f}x; "
          f"pass@1 after {a.budget_s:.0f}s: postrl {p['eval_pass@1']:.3f} vs trl {q['eval_pass@1']:.3f}")
    bench.result("completions_per_s_ratio", f"{ratio:.2f}", target=3)


if __name__ == "__main__":
    main()
