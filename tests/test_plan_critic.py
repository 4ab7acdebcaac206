"""`postrl plan` with PPO's critic (`critic.model`): its memory and its seconds worked out by hand
for a two-layer model, nothing else in the step changed, and the command's table."""

import dataclasses

import pytest

from postrl.cli import main
from postrl.config.loading import load_config
from postrl.config.schema import LoraConfig
from postrl.cost.hardware import Hardware
from postrl.cost.host import HostTimes
from postrl.cost.memory import memory_per_rank
from postrl.cost.shape import ModelFacts, Workload, critic_facts, facts_of
from postrl.cost.step import critic_flops, learner_flops, step_cost

RECIPE = "recipes/default.yaml"  # 1 epoch of 2 minibatches, rl.kl_coef 0.01
PPO = ["rl.advantage=gae", "critic.model=policy"]
# per layer q, k, v, o 8 -> 8 and an MLP 8 -> 16 -> 8: P = 2 x (4 x 64 + 3 x 128) = 1280
LINEARS = tuple((f"model.layers.{i}.{name}", i_, o_) for i in range(2) for name, i_, o_ in (
    ("self_attn.q_proj", 8, 8), ("self_attn.k_proj", 8, 8), ("self_attn.v_proj", 8, 8), ("self_attn.o_proj", 8, 8),
    ("mlp.gate_proj", 8, 16), ("mlp.up_proj", 8, 16), ("mlp.down_proj", 16, 8)))
FACTS = ModelFacts(params=1000, matmul=1280, head=10 * 8, linears=LINEARS, layers=2, hidden=8, intermediate=16,
                   heads=2, kv_heads=2, head_dim=4, vocab=10, config=None)  # no config: not fused, rows padded
WORK = Workload(prompts=2, samples=4, prompt_tokens=3, new_tokens=5, completion_tokens=5)  # 8 rows of 8 tokens
Q_LORA = LoraConfig(r=2, target_modules=["q_proj"])  # 2 layers x 2 x (8 + 8) = 64 adapter weights
# 1 GFLOP/s and 1 GB/s, reached whole: a second is 1e9 FLOPs or bytes
HW = Hardware("by hand", 1e9, 1.0, 1e9, 1.0, 1.0, True, "by hand")


def test_a_value_model_trains_its_head_and_the_backbone_it_runs():
    # the value head: hidden + 1 = 9; every weight of a tied model (its head is the embeddings it reads)
    assert FACTS.value_trained(LoraConfig(r=0)) == 1000 + 9
    # untied, the vocabulary head (10 x 8) is never run and never trained
    assert dataclasses.replace(FACTS, tied=False).value_trained(LoraConfig(r=0)) == 1000 - 80 + 9
    assert FACTS.value_trained(Q_LORA) == 64 + 9  # a LoRA copy: its own adapters, the base frozen


def test_the_critic_memory_by_hand():
    cfg = load_config(RECIPE, [*PPO, "model.dtype=bfloat16"])
    mem = memory_per_rank(cfg, FACTS, WORK, LoraConfig(r=0), critic=FACTS)
    # weights (1000 + 9) x 2 bytes; 1009 trained: moments 8 and float32 masters 4 bytes each
    assert mem.critic == 2018 + 8 * 1009 + 4 * 1009 == 14126
    assert mem.critic_gradients == 2 * 1009
    # one micro-batch, 8 rows / 2 minibatches = 4 rows of 8 tokens; per token 2 layers x (8 x 8 + 4 x 16)
    # values x 2 bytes, every layer's kept (no checkpointing) and no logits
    assert mem.critic_activations == 4 * 8 * 2 * 128 * 2 == 16384
    bare = memory_per_rank(load_config(RECIPE, ["model.dtype=bfloat16"]), FACTS, WORK, LoraConfig(r=0))
    assert dataclasses.replace(mem, critic=0.0, critic_gradients=0.0, critic_activations=0.0) == bare
    # the policy's activations (768 MiB of logits chunks on a GPU) are the larger: the critic adds its state
    assert mem.total - bare.total == 14126 + 2018

    lora = memory_per_rank(cfg, FACTS, WORK, Q_LORA, critic=FACTS)  # the copy carries its own adapters
    assert (lora.critic, lora.critic_gradients) == ((1000 + 64 + 9) * 2 + 12 * 73, 2 * 73)
    separate = load_config(RECIPE, ["rl.advantage=gae", "critic.model=a/separate-model", "model.dtype=bfloat16"])
    untied = dataclasses.replace(FACTS, tied=False)
    own = memory_per_rank(separate, FACTS, WORK, Q_LORA, critic=untied)  # every weight of its own but the head
    assert (own.critic, own.critic_gradients) == ((1000 + 9) * 2 + 12 * 929, 2 * 929)


def test_the_critic_activations_bound_the_update_when_they_are_the_larger():
    # the policy checkpointed (each layer's input + one layer's: 32 x (2 x 8 + 128) x 2 = 9216 bytes) and
    # a logits chunk of 1 KiB (three: 3072 bytes); the critic, not checkpointed, keeps 16384
    cfg = load_config(RECIPE, [*PPO, "model.dtype=bfloat16", "model.gradient_checkpointing=true",
                               "model.logits_chunk_mib=0.0009765625"])
    mem = memory_per_rank(cfg, FACTS, WORK, LoraConfig(r=0), critic=FACTS)
    assert mem.activations == 9216 + 3072 and mem.critic_activations == 16384
    steady = 2000 + 2000 + 8000 + 4000 + 14126  # weights, reference, moments, masters, the critic
    assert mem.total == steady + 2000 + 2018 + 16384  # both gradients, the critic's activations


def test_the_critic_flops_by_hand():
    cfg = load_config(RECIPE, PPO)
    # 8 padded rows x 8 tokens = 64; attention 4 x 2 layers x context 4 x 2 heads x 4 = 256 a token forward
    values, steps = critic_flops(cfg, FACTS, WORK)
    assert (values.body, values.head) == (2 * 1280 * 64 + 256 * 64, 0)  # no vocabulary head
    assert (steps.body, steps.head) == (6 * 1280 * 64 + 3 * 256 * 64, 0)
    cfg.model.lora = Q_LORA  # the copy trains its adapters: 4 P + 6 per adapter weight
    assert critic_flops(cfg, FACTS, WORK)[1].body == (4 * 1280 + 6 * 64) * 64 + 3 * 256 * 64
    cfg.critic.model = "a/separate-model"  # no adapters of its own: every weight
    assert critic_flops(cfg, FACTS, WORK)[1].body == 6 * 1280 * 64 + 3 * 256 * 64
    checkpointed = load_config(RECIPE, [*PPO, "model.gradient_checkpointing=true"])
    assert learner_flops(checkpointed, FACTS, WORK)[1].body == 8 * 1280 * 64 + 3 * 256 * 64  # the policy's
    assert critic_flops(checkpointed, FACTS, WORK)[1].body == 6 * 1280 * 64 + 3 * 256 * 64  # built before it


def test_a_critic_adds_its_worked_seconds_to_the_step_and_nothing_else():
    host = HostTimes(decode_step=1e-4, reference=2e-4, update=3e-4, critic_values=1e-3, critic_steps=1e-4)
    with_critic = step_cost(load_config(RECIPE, PPO), FACTS, WORK, HW, host, critic=FACTS)
    bare = step_cost(load_config(RECIPE, []), FACTS, WORK, HW, host)
    # values: 180224 FLOPs = 0.18 ms on the device, under its 1 ms host part (the larger counts on a GPU);
    # steps: 1 epoch of 540672 FLOPs = 0.54 ms over the 0.1 ms host part; AdamW: 2 minibatches x 32 bytes x 1009
    worked = 1e-3 + 540672 / 1e9 + 2 * 32 * 1009 / 1e9
    assert with_critic.critic_s == pytest.approx(worked, rel=1e-12)
    assert with_critic.step_s - bare.step_s == pytest.approx(worked, rel=1e-9)
    assert with_critic.learning_s == with_critic.reference_s + with_critic.update_s + with_critic.critic_s
    assert dataclasses.replace(with_critic, critic_s=0.0) == bare  # every other phase as without a critic
    assert bare.critic_s == 0.0 and bare.learning_s == bare.reference_s + bare.update_s


def test_the_critic_facts_are_the_policy_or_the_named_model():
    assert critic_facts(load_config(RECIPE, []), FACTS) is None
    assert critic_facts(load_config(RECIPE, PPO), FACTS) is FACTS
    named = critic_facts(load_config(RECIPE, ["rl.advantage=gae", "critic.model=tiny-calc"]), FACTS)
    assert named == facts_of("tiny-calc")[0] and named.layers > 0


def test_plan_prints_the_critic_phase_and_memory(capsys):
    capsys.readouterr()
    assert main(["plan", RECIPE, *PPO, "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    for label in ("critic                 policy: a value head on a copy of the policy", "  critic ",
                  "  critic gradients ", "  critic activations ", "no vocabulary head"):
        assert label in out, label
    phase = next(line for line in out.splitlines() if line.startswith("critic ") and " s   values " in line)
    assert float(phase.split()[1]) > 0
    assert main(["plan", RECIPE, "--hardware", "h100-sxm"]) == 0
    assert "critic" not in capsys.readouterr().out  # without one, the table as before
