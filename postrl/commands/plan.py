"""postrl plan RECIPE [overrides]: print the effective batch arithmetic and exit.

With --hardware NAME, also what one step and the whole run cost on that hardware (postrl.cost):
seconds per phase, what bounds a step, what a pipelined run would gain, memory per learner rank.
NAME: cpu (this machine, measured now), a GPU preset (h200, h100-sxm, h100-pcie, a100-80gb, l40s, l4;
h100 and a100 are h100-sxm and a100-80gb, and the table says which preset a name meant) or
custom:tflops=T,tbps=B,gib=G. The formulas and their assumptions: docs/hardware.md.
"""

from __future__ import annotations

from dataclasses import fields


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="print the batch arithmetic of a recipe (and its cost on given hardware)",
                       description=__doc__)
    p.add_argument("recipe", nargs="?")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module (name or .py file) that registers domains, verifiers, reward terms "
                        "or monitors; loaded before the recipe is checked (repeatable)")
    p.add_argument("--hardware", metavar="NAME", help="cpu, a GPU preset (h200, h100-sxm, h100-pcie, a100-80gb, "
                                                       "l40s, l4; h100 = h100-sxm, a100 = a100-80gb) or "
                                                       "custom:tflops=T,tbps=B,gib=G")
    p.add_argument("--learners", type=int, metavar="N", help="learner ranks for memory per rank, replicated and "
                                                               "sharded (default: train.learners)")
    p.add_argument("--prompt-tokens", type=float, metavar="N", help="mean prompt length in tokens (default: "
                                                                     "measured on tasks drawn from the recipe)")
    p.add_argument("--completion-tokens", type=float, metavar="N", help="mean completion length in tokens "
                                                                         "(default: train.max_new_tokens, an upper bound)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.extensions import load_recipe
    from postrl.names import check_names

    cfg = load_recipe(args.recipe, args.overrides, args.imports)
    check_names(cfg)
    if args.hardware:
        from postrl.cost.hardware import check_hardware

        check_hardware(args.hardware)
    t = cfg.train
    completions = t.prompts_per_step * t.samples_per_prompt
    per_mb = completions // t.minibatches
    lines = [
        f"domains                {', '.join(f'{n} (weight {d.weight:g})' for n, d in cfg.domains.items())}",
        f"prompts per step       {t.prompts_per_step}",
        f"samples per prompt     {t.samples_per_prompt}",
        f"completions per step   {t.prompts_per_step} x {t.samples_per_prompt} = {completions}",
        f"tokens per step        <= {completions} x {t.max_new_tokens} = {completions * t.max_new_tokens} new tokens",
        f"minibatch              {completions} / {t.minibatches} = {per_mb} completions",
        f"optimiser steps/batch  {t.ppo_epochs} epochs x {t.minibatches} minibatches = {t.ppo_epochs * t.minibatches}",
        f"total                  {t.total_steps} steps, {t.total_steps * completions} completions, "
        f"{t.total_steps * t.ppo_epochs * t.minibatches} optimiser steps",
    ]
    if args.hardware:
        lines += cost_lines(cfg, args.hardware, args.learners or t.learners, args.prompt_tokens, args.completion_tokens)
    print("\n".join(lines))
    return 0


def cost_lines(cfg, hardware_name: str, learners: int, prompt_tokens: float | None,
               completion_tokens: float | None) -> list[str]:
    """The cost table: hardware, model, the step's phases, the run, memory per rank."""
    from postrl.cost.hardware import hardware
    from postrl.cost.host import host_times
    from postrl.cost.shape import critic_facts, matmul_shapes, model_facts, workload
    from postrl.cost.step import step_cost

    model, tok = model_facts(cfg)
    critic = critic_facts(cfg, model)
    work = workload(cfg, tok, prompt_tokens, completion_tokens)
    hw = hardware(hardware_name, cfg.run.threads, matmul_shapes(cfg, model, work), cfg.model.dtype)
    host = host_times(cfg, model, work, tok, on_cpu=not hw.accelerator, critic=critic)
    step = step_cost(cfg, model, work, hw, host, critic)
    return [*_setting_lines(cfg, hardware_name, hw, model, work, critic),
            *_phase_lines(cfg, model, work, hw, step, host, critic), *_bound_lines(step),
            *_run_lines(cfg, model, work, hw, step, host.decode_step), *_memory_lines(cfg, model, work, hw, learners, critic)]


def _setting_lines(cfg, name: str, hw, model, work, critic) -> list[str]:
    lora = cfg.model.lora
    if hw.accelerator:
        device = (f"{hw.peak_flops / 1e12:g} TFLOP/s dense bf16 x {hw.flops_share:.2f} assumed = "
                  f"{hw.flops / 1e12:.0f} TFLOP/s; {hw.bandwidth / 1e12:g} TB/s x {hw.bandwidth_share:.2f} assumed = "
                  f"{hw.bytes_per_s / 1e12:.2f} TB/s; {hw.memory_gib:g} GiB")
    else:
        device = (f"{cfg.model.dtype} matmul {hw.flops / 1e9:.1f} GFLOP/s (a decode step's {hw.rate('decode') / 1e9:.1f}, "
                  f"the vocabulary head's {hw.rate('head') / 1e9:.1f}), "
                  f"copy {hw.bandwidth / 1e9:.1f} GB/s, {hw.memory_gib:.0f} GiB RAM")
    trained = (f"LoRA r {lora.r} on {', '.join(lora.target_modules)}: {_count(model.adapters(lora))} weights"
               if lora.r > 0 else f"every weight ({_count(model.params)})")
    lines = [
        "",
        f"hardware               {hw.name}{_meant(name, hw)}: {device} ({hw.source})",
        f"model                  {cfg.model.name}: {_count(model.params)} parameters, {model.layers} layers, hidden "
        f"{model.hidden}, {model.heads} heads ({model.kv_heads} kv) of {model.head_dim}, vocab {model.vocab}",
        f"trained                {trained}, {cfg.model.dtype}",
        f"step shape             {work.prompts} prompts of {work.prompt_tokens:.1f} tokens x {work.samples} samples = "
        f"{work.rows} completions of {work.completion_tokens:g} tokens"
        + (" (every one to max_new_tokens: an upper bound)" if work.completion_tokens == work.new_tokens else
           f" on average, up to {work.new_tokens}"),
    ]
    if critic is not None:
        lines.append(f"critic                 {_critic_model(cfg, critic)}")
    if hw.accelerator and cfg.model.dtype == "float32":
        lines.append("note                   float32 weights: the figures are bf16 tensor-core rates; a float32 run "
                     "is far slower (set model.dtype: bfloat16)")
    return lines


def _critic_model(cfg, critic) -> str:
    """What the critic is and what it trains (`postrl.cost.shape.critic_lora`)."""
    from postrl.cost.shape import critic_lora

    trains = _count(critic.value_trained(critic_lora(cfg, cfg.model.lora)))
    if cfg.critic.model == "policy":
        own = ": its own adapters and the head, the base frozen" if cfg.model.lora.r > 0 else ""
        return f"policy: a value head on a copy of the policy ({_count(critic.params)} parameters), {trains} weights trained{own}"
    return (f"{cfg.critic.model}: a value head on its own model, {_count(critic.params)} parameters, "
            f"{critic.layers} layers, hidden {critic.hidden}; {trains} weights trained")


def _phase_lines(cfg, model, work, hw, step, host, critic) -> list[str]:
    from postrl.cost.step import critic_flops, extra_forwards, learner_flops, sync_bytes

    forward, epoch = learner_flops(cfg, model, work, attention=hw.accelerator)
    measured = "host, overlapped" if hw.accelerator else "measured here, added"
    fused = model.fused(cfg.model.lora)
    per_token = "4 P + 6 per adapter weight (LoRA: frozen weights get no weight gradient)" if cfg.model.lora.r > 0 \
        else "6 P (forward, input and weight gradients)"
    extra = "; one more forward (proximal policy or rollout correction)" if extra_forwards(cfg) else ""
    reference = (f"2 P per decoder token ({work.body_tokens(fused):,.0f}: "
                 f"{'a group prompt once, fused' if fused else 'padded rows'}) + the head: {_flop(forward.body + forward.head)}"
                 if cfg.rl.kl_coef > 0 else "rl.kl_coef 0: no reference pass, the advantages")
    lines = [
        f"sampling               {step.sampling_s:8.2f} s   prefill {step.prefill_s:.2f} s + {work.new_tokens - 1} "
        f"decode steps {step.decode_s:.2f} s ({step.decode_bound}-bound) + {step.host_s:.2f} s "
        f"({host.decode_step * 1e3:.1f} ms a step, {measured})",
        f"reference log-probs    {step.reference_s:8.2f} s   {reference} + {host.reference:.2f} s ({measured})",
        f"update                 {step.update_s:8.2f} s   {per_token} per token: {cfg.train.ppo_epochs} x "
        f"{_flop(epoch.body + epoch.head)} + {host.update:.2f} s ({measured}){extra}",
        f"sync                   {step.sync_s:8.2f} s   " + (f"{sync_bytes(cfg, model) / 2**20:,.0f} MiB of weights"
                                                          if step.sync_s else "none: the sampler uses the learner's weights"),
    ]
    if critic is not None:
        values, steps = critic_flops(cfg, critic, work, attention=hw.accelerator)
        lines.insert(3, f"critic                 {step.critic_s:8.2f} s   values {_flop(values.body)} + {host.critic_values:.2f} s"
                        f"; {cfg.train.ppo_epochs} x {_flop(steps.body)} of steps + {host.critic_steps:.2f} s ({measured})"
                        f"; no vocabulary head")
    return lines


def _bound_lines(step) -> list[str]:
    sampling = step.sampling_s + step.sync_s
    side = "sampling" if sampling >= step.learning_s else "learning"
    proximal, bare = max(sampling, step.learning_s + step.forward_s), max(sampling, step.learning_s)
    return [
        f"step                   {step.step_s:8.2f} s   sampling {sampling:.2f} s + learning {step.learning_s:.2f} s: "
        f"{side} bounds the step",
        f"pipelined              {proximal:8.2f} s   max(sampling, learning + a proximal forward): "
        f"{step.step_s / proximal:.2f}x; {bare:.2f} s without it (pipeline.proximal: behaviour): "
        f"{step.step_s / bare:.2f}x (pipeline.max_staleness >= 1, sampling on devices of its own)",
    ]


def _run_lines(cfg, model, work, hw, step, host: float) -> list[str]:
    from postrl.cost.step import eval_seconds, evals_in_run

    evals, one_eval = evals_in_run(cfg), eval_seconds(cfg, model, work, hw, host)
    total = cfg.train.total_steps * step.step_s + evals * one_eval
    return [f"run                    {_duration(total):>10}   {cfg.train.total_steps} steps x {step.step_s:.2f} s + "
            f"{evals} eval(s) x {one_eval:.2f} s"]


def _memory_lines(cfg, model, work, hw, learners: int, critic) -> list[str]:
    from postrl.config.schema import LoraConfig
    from postrl.cost.hardware import GIB
    from postrl.cost.memory import Memory, memory_per_rank

    lora = cfg.model.lora if cfg.model.lora.r > 0 else LoraConfig(r=16)
    columns = [("every weight", LoraConfig(r=0), False), (f"LoRA r {lora.r}", lora, False)]
    if learners > 1:
        columns = [c for name, lc, _ in columns for c in ((name, lc, False), (f"{name}, fsdp/{learners}", lc, True))]
    mems = [memory_per_rank(cfg, model, work, lc, learners, sharded, hw.accelerator, critic)
            for _, lc, sharded in columns]
    width = max(len(name) for name, *_ in columns) + 3
    lines = [f"memory per rank, GiB   {''.join(f'{name:>{width}}' for name, *_ in columns)}"]
    for f in fields(Memory):
        if f.name.startswith("critic") and critic is None:
            continue
        lines.append(f"  {f.name.replace('_', ' '):21}{''.join(f'{getattr(m, f.name) / GIB:>{width}.3f}' for m in mems)}")
    lines.append(f"  {'peak':21}{''.join(f'{m.total / GIB:>{width}.3f}' for m in mems)}   ({hw.memory_gib:.4g} GiB "
                 f"on {hw.name})")
    ranks = f"{learners} ranks, replicated or sharded" if learners > 1 else "1 rank (--learners N: N ranks)"
    trained = f"LoRA r {lora.r}" if cfg.model.lora.r > 0 else "every weight"
    lines.append(f"  the recipe trains {trained}, {cfg.model.dtype}, on {cfg.train.learners} learner(s), train.shard "
                 f"{cfg.train.shard}; per rank of {ranks}")
    return lines


def _meant(name: str, hw) -> str:
    """Which preset a name the user typed meant, where it is not the preset's own ("h100": h100-sxm)."""
    return f" (the preset {name!r} means)" if hw.name != name else ""


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 \
        else f"{seconds:.1f} s"


def _flop(n: float) -> str:
    return f"{n / 1e12:.2f} TFLOP" if n >= 1e12 else f"{n / 1e9:.2f} GFLOP"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"
