"""`postrl plan --hardware`: the presets and custom specs, the cost model's counts worked out by hand,
memory per rank, the CPU probe, and the command's table. No timing is asserted."""

import pytest

from postrl.cli import main
from postrl.config.loading import load_config
from postrl.config.schema import LoraConfig
from postrl.cost.hardware import (
    COMMON_NAMES,
    GPU_BANDWIDTH_SHARE,
    GPU_FLOPS_SHARE,
    GPU_PRESETS,
    hardware,
    preset_name,
    probe_cpu,
)
from postrl.cost.memory import memory_per_rank
from postrl.cost.shape import ModelFacts, Workload
from postrl.cost.step import learner_flops
from postrl.errors import UserError

RECIPE = "recipes/default.yaml"
# a two-layer model small enough to count by hand: per layer q, k, v, o 8 -> 8 and an MLP 8 -> 16 -> 8
LINEARS = tuple((f"model.layers.{i}.{name}", i_, o_) for i in range(2) for name, i_, o_ in (
    ("self_attn.q_proj", 8, 8), ("self_attn.k_proj", 8, 8), ("self_attn.v_proj", 8, 8), ("self_attn.o_proj", 8, 8),
    ("mlp.gate_proj", 8, 16), ("mlp.up_proj", 8, 16), ("mlp.down_proj", 16, 8)))
FACTS = ModelFacts(params=1000, matmul=2 * (4 * 64 + 3 * 128), head=10 * 8, linears=LINEARS, layers=2, hidden=8,
                   intermediate=16, heads=2, kv_heads=2, head_dim=4, vocab=10, config=None)
WORK = Workload(prompts=2, samples=4, prompt_tokens=3, new_tokens=5, completion_tokens=5)


def test_every_preset_has_its_datasheet_and_the_assumed_shares():
    for name, preset in GPU_PRESETS.items():
        hw = hardware(name)
        assert hw.peak_flops == preset.tflops * 1e12 and hw.bandwidth == preset.tbps * 1e12
        assert hw.flops == hw.rate("decode") == hw.rate("head") == preset.tflops * 1e12 * GPU_FLOPS_SHARE
        assert hw.bytes_per_s == preset.tbps * 1e12 * GPU_BANDWIDTH_SHARE
        assert hw.memory_gib == preset.gib and hw.accelerator and preset.source.startswith("https://")
    assert {"h200", "h100-sxm", "h100-pcie", "a100-80gb", "l40s", "l4"} <= set(GPU_PRESETS)
    h100 = hardware("h100-sxm")
    assert (h100.peak_flops, h100.bandwidth, h100.memory_gib) == (989e12, 3.35e12, 80)


def test_torch_device_names_find_their_preset_first_match_wins():
    def preset(device: str) -> str:
        return next(name for name, p in GPU_PRESETS.items() if p.device_name in device)

    assert preset("NVIDIA H100 PCIe") == "h100-pcie"
    assert preset("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert preset("NVIDIA L40S") == "l40s" and preset("NVIDIA L4") == "l4"


def test_a_custom_spec_is_three_positive_numbers():
    hw = hardware("custom:tflops=100,tbps=1.5,gib=40")
    assert (hw.peak_flops, hw.bandwidth, hw.memory_gib, hw.accelerator) == (1e14, 1.5e12, 40.0, True)
    for bad in ("custom:tflops=100,tbps=1.5", "custom:tflops=x,tbps=1,gib=1", "custom:tflops=-1,tbps=1,gib=1",
                "custom:tflops=1,tbps=1,gib=1,watts=300", "custom:"):
        with pytest.raises(UserError, match="malformed hardware .*custom:tflops=T,tbps=B,gib=G.*h100-sxm"):
            hardware(bad)


def test_an_unknown_name_lists_the_presets():
    with pytest.raises(UserError, match="unknown hardware 'h1000': one of cpu, h200, h100-pcie, h100-sxm"):
        hardware("h1000")


def test_the_common_names_mean_their_presets_and_say_so():
    assert hardware("h100") == hardware("h100-sxm") and hardware("h100").name == "h100-sxm"
    assert hardware("a100") == hardware("a100-80gb") and hardware("a100").name == "a100-80gb"
    assert hardware("H100") == hardware("h100-sxm") and hardware("L40S").name == "l40s"  # any case
    assert (preset_name("h100"), preset_name("a100"), preset_name("h100-pcie"), preset_name("h1000")) == (
        "h100-sxm", "a100-80gb", "h100-pcie", None)
    assert set(COMMON_NAMES.values()) <= set(GPU_PRESETS)
    with pytest.raises(UserError) as unknown:
        hardware("b200")
    assert str(unknown.value) == ("unknown hardware 'b200': one of cpu, h200, h100-pcie, h100-sxm, a100-80gb, l40s, l4 "
                                  "(h100 = h100-sxm, a100 = a100-80gb), or custom:tflops=T,tbps=B,gib=G")


def test_lora_adapters_are_r_times_in_plus_out_per_targeted_layer():
    assert FACTS.adapters(LoraConfig(r=0)) == 0
    # q and v of both layers: 4 linears x 2 x (8 + 8) = 128 at r 2
    assert FACTS.adapters(LoraConfig(r=2, target_modules=["q_proj", "v_proj"])) == 128
    # down_proj: 16 in, 8 out: 2 layers x 4 x 24 = 192 at r 4
    assert FACTS.adapters(LoraConfig(r=4, target_modules=["down_proj"])) == 192


def test_update_flops_by_hand():
    cfg = load_config(RECIPE, ["rl.kl_coef=0.01"])
    # not fused (no config): decoder tokens 8 rows x (3 + 5) = 64; head positions 8 x 5 = 40
    # attention forward: 4 x 2 layers x context (3 + 5) / 2 x 2 heads x 4 = 256 per token, x 64 = 16384
    forward, update = learner_flops(cfg, FACTS, WORK)
    assert (forward.body, forward.head) == (2 * 1280 * 64 + 16384, 2 * 80 * 40)
    # every weight: 6 P; the head's chunks recomputed in the backward: 8 Vd
    assert (update.body, update.head) == (6 * 1280 * 64 + 3 * 16384, 8 * 80 * 40)
    cfg.model.lora = LoraConfig(r=2, target_modules=["q_proj"])  # 2 layers x 2 x 16 = 64 adapter weights
    _, lora_update = learner_flops(cfg, FACTS, WORK)
    assert (lora_update.body, lora_update.head) == (4 * 1280 * 64 + 6 * 64 * 64 + 3 * 16384, 6 * 80 * 40)


def test_the_fused_forward_computes_a_group_prompt_once_per_minibatch_holding_the_group():
    assert WORK.body_tokens(fused=False) == 8 * (3 + 5)
    assert WORK.body_tokens(fused=True) == 2 * 3 + 8 * 5
    # 2 minibatches of shuffled rows: a group of 4 is in both but with chance 2 x 0.5^4 = 1/8
    assert WORK.body_tokens(fused=True, minibatches=2) == 2 * (2 * (1 - 0.5**4)) * 3 + 8 * 5


def test_memory_per_rank_shrinks_with_sharding_and_with_lora():
    cfg = load_config(RECIPE, ["model.dtype=bfloat16"])
    lora = LoraConfig(r=2, target_modules=["q_proj"])
    full = memory_per_rank(cfg, FACTS, WORK, LoraConfig(r=0))
    sharded = memory_per_rank(cfg, FACTS, WORK, LoraConfig(r=0), ranks=4, sharded=True)
    adapters = memory_per_rank(cfg, FACTS, WORK, lora)
    # bf16: 2 bytes a weight; AdamW's moments 8 and the float32 masters 4 bytes a trained weight
    assert (full.weights, full.gradients, full.moments, full.masters) == (2000, 2000, 8000, 4000)
    assert full.reference == 2000  # a frozen copy for the KL term
    assert (sharded.weights, sharded.gradients, sharded.moments, sharded.masters) == (500, 500, 2000, 1000)
    assert (adapters.gradients, adapters.moments, adapters.masters, adapters.reference) == (128, 512, 256, 0)
    assert sharded.total < full.total and adapters.total < full.total


def test_float32_training_keeps_no_master_copy():
    cfg = load_config(RECIPE, [])
    assert memory_per_rank(cfg, FACTS, WORK, LoraConfig(r=0)).masters == 0


def test_the_cpu_probe_measures_positive_figures():
    hw = probe_cpu(threads=1, shapes={"decode": (8, 32, 32), "head": (8, 32, 64)}, seconds=0.05)
    assert hw.peak_flops > 0 and hw.rate("decode") > 0 and hw.rate("head") > 0 and hw.bandwidth > 0
    assert hw.memory_gib > 0 and not hw.accelerator and hw.flops_share == 1.0


def in_process(args, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_every_phase_the_run_and_memory_per_rank(capsys):
    code, out, _ = in_process(["plan", RECIPE, "--hardware", "h100-sxm", "--learners", "4"], capsys)
    assert code == 0
    assert out.startswith("domains ")  # the batch arithmetic first, unchanged
    for label in ("hardware               h100-sxm", "model                  tiny-arith", "sampling ", "reference log-probs ",
                  "update ", "sync ", "step ", "pipelined ", "run ", "memory per rank, GiB", "every weight, fsdp/4",
                  "LoRA r 16, fsdp/4", "  peak "):
        assert label in out, label


def test_plan_takes_a_common_name_and_states_the_preset_it_meant(capsys):
    code, out, _ = in_process(["plan", RECIPE, "--hardware", "h100"], capsys)
    assert code == 0
    assert "hardware               h100-sxm (the preset 'h100' means): 989 TFLOP/s dense bf16" in out
    _, sxm, _ = in_process(["plan", RECIPE, "--hardware", "h100-sxm"], capsys)
    assert "hardware               h100-sxm: 989 TFLOP/s" in sxm  # a preset's own name: nothing to say


def test_plan_refuses_unknown_hardware_in_one_line(capsys):
    code, out, err = in_process(["plan", RECIPE, "--hardware", "tpu"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown hardware 'tpu'" in err and "custom:tflops=T" in err
    assert "h100 = h100-sxm, a100 = a100-80gb" in err  # the common names among the known ones


def test_lora_without_dropout_is_fused_and_samples_with_the_adapters_folded_in():
    """FastLM runs plain LoRA (factors beside the weights in the update, folded in for sampling);
    dropout sends the model through the Hugging Face forward, which samples with the factors."""
    import dataclasses
    import types

    from postrl.cost.step import sampling_seconds

    llama = dataclasses.replace(FACTS, config=types.SimpleNamespace(model_type="llama"))
    plain, dropped = LoraConfig(r=2, target_modules=["q_proj"]), LoraConfig(r=2, target_modules=["q_proj"], dropout=0.1)
    assert llama.fused(LoraConfig(r=0)) and llama.fused(plain) and not llama.fused(dropped)
    assert not FACTS.fused(plain)  # not a covered architecture
    gpu = hardware("h200")  # a datasheet: nothing measured
    base = sampling_seconds(llama, gpu, WORK, LoraConfig(r=0), 4, 0.0)
    assert sampling_seconds(llama, gpu, WORK, plain, 4, 0.0) == base
    assert sampling_seconds(llama, gpu, WORK, dropped, 4, 0.0)[1] > base[1]
