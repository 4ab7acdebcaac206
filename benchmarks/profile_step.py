"""Where a postrl training step spends its time: phases, then the top operators (torch profiler).

    .venv/bin/python benchmarks/profile_step.py [--steps 4] [--threads 1] [--no-fastlm] [RECIPE] [key=value ...]

Runs the loop's own parts (policy.sample, score_chunk, learner.build_batch,
learner.update) on the recipe's model and batch shape, times each phase over `--steps` steps
(after one warm-up step), then profiles one more step with torch.profiler and prints the
operators that took the most self time. Not a test; absolute times depend on the machine's load.
"""

from __future__ import annotations

import time

import torch
from _harness import parser  # benchmarks/, on the path when this script runs

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.curriculum.sampler import TaskSampler
from postrl.engines.orders import attach_scores, reward_terms, score_chunk
from postrl.learner.learner import Learner
from postrl.model.fastlm import FastLM
from postrl.model.lora import make_reference
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.seeding import step_generator
from postrl.tasks.catalog import build_domains


class Step:
    def __init__(self, cfg):
        self.cfg = cfg
        self.domains = build_domains(cfg)
        model, tok = load_model(cfg.model.name, cfg.model.dtype, log=lambda *a: None)
        self.policy = Policy(model, tok)
        ref = make_reference(model) if cfg.rl.kl_coef > 0 else None
        self.learner = Learner(self.policy, ref, cfg.train, cfg.rl)
        self.sampler = TaskSampler(self.domains, cfg.seed)
        self.weights = {name: d.weight for name, d in cfg.domains.items()}
        self.gen = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
        self.step = 0

    def __call__(self) -> dict[str, float]:
        """One loop step; seconds per phase."""
        cfg, t = self.cfg, [time.perf_counter()]
        tasks = self.sampler.next_batch(cfg.train.prompts_per_step, self.weights)
        samples = self.policy.sample(tasks, cfg.train.samples_per_prompt, self.gen,
                                     step_generator(cfg.seed, self.step, 0))
        t.append(time.perf_counter())
        attach_scores(samples, score_chunk(samples, self.domains, reward_terms(cfg)))
        t.append(time.perf_counter())
        batch = self.learner.build_batch(samples, cfg.rl.kl_coef)  # reference log-probs happen here
        t.append(time.perf_counter())
        self.learner.update(batch, cfg.rl.kl_coef, step_generator(cfg.seed, self.step, 1))
        t.append(time.perf_counter())
        self.step += 1
        names = ("sample", "reward", "build_batch (ref logprobs)", "update (fwd+bwd+optim)")
        return {n: b - a for n, a, b in zip(names, t, t[1:])}


def main() -> None:
    ap = parser(__doc__, record=False)  # a profile: no RESULT line
    ap.add_argument("recipe", nargs="?", default="recipes/default.yaml")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--no-fastlm", action="store_true", help="run every forward through transformers (the baseline)")
    args = ap.parse_args()
    if args.no_fastlm:
        FastLM.wrap = staticmethod(lambda model: None)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.recipe, args.overrides)
    step = Step(cfg)
    step()  # warm-up
    totals: dict[str, float] = {}
    for _ in range(args.steps):
        for name, s in step().items():
            totals[name] = totals.get(name, 0.0) + s
    whole = sum(totals.values())
    print(f"threads={args.threads}  {cfg.train.prompts_per_step}x{cfg.train.samples_per_prompt} completions/step, "
          f"max_new_tokens={cfg.train.max_new_tokens}, {args.steps} steps")
    for name, s in totals.items():
        print(f"  {name:30s} {s / args.steps * 1000:8.1f} ms/step  {100 * s / whole:5.1f}%")
    with torch.profiler.profile() as prof:
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48))


if __name__ == "__main__":
    main()
