"""What a recipe costs on given hardware: one training step phase by phase, memory per rank, the run.

    hw = hardware("h100-sxm")                   # cost.hardware: a GPU preset (or a common name: h100) | "cpu"
                                                #   (measured now) | "custom:tflops=T,tbps=B,gib=G"
    model, tok = model_facts(cfg)               # cost.shape: the recipe's model from its config and tokenizer
    critic = critic_facts(cfg, model)           #   PPO's critic's model (critic.model), None without one
    work = workload(cfg, tok)                   #   the step's shape; prompt length measured on the recipe's tasks
    host = host_times(cfg, model, work, tok, not hw.accelerator, critic)  # cost.host: what the formulas leave out
    step = step_cost(cfg, model, work, hw, host, critic)                   # cost.step: the formulas
    mem = memory_per_rank(cfg, model, work, cfg.model.lora, ranks=4, sharded=True, critic=critic)   # cost.memory

The hardware's figures (`hardware`: datasheet presets, the CPU measured) are apart from the
arithmetic that uses them (`step`, `memory`), which takes any `Hardware`. `postrl plan --hardware`
prints it all (`postrl.commands.plan`); docs/hardware.md has the formulas and their assumptions.

What it does not know: the model's answers (completions run to max_new_tokens unless a mean length
is given, and a group's samples are taken as all different), data parallelism's speed-up and its
all-reduce, vLLM's own kernels (sampling is modelled as postrl's engine), multi-turn episodes.
This file imports nothing: each caller names the module it uses.
"""
