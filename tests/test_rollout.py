"""The rollout engine: exact behaviour log-probs, transformers-identical greedy output, stopping
rules, determinism, and results that do not depend on batch compaction or the forward used."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from postrl.builtin_models import load_model
from postrl.model.fastlm import FastLM
from postrl.model.logprobs import token_logprobs
from postrl.sampling import generate as rollout
from postrl.sampling.generate import GenParams, generate

TEXTS = ["1+2=", "47+38=", "3=", "123+456+7=", "9*9=", "60-17="]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    prompts = [tok(t)["input_ids"] for t in TEXTS] * 4  # mixed lengths: 3 to 11 tokens
    return model, tok, prompts


def sample(tiny, params, seed=0, **kw):
    model, tok, prompts = tiny
    gen = torch.Generator().manual_seed(seed)
    return generate(model, kw.pop("prompts", prompts), params, kw.pop("eos_id", tok.eos_token_id),
                    tok.pad_token_id, gen, decode=lambda ids: tok.decode(ids, skip_special_tokens=True), **kw)


def reference_logprobs(model, prompts, gens, temperature):
    """log softmax(logits / T) of each sampled token from one plain transformers forward per row."""
    out = []
    for p, g in zip(prompts, gens):
        ids = torch.tensor([p + g.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float() / temperature
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_a_full_forward(tiny, temperature):
    model, _, prompts = tiny
    gens = sample(tiny, GenParams(8, temperature=temperature))
    for g, ref in zip(gens, reference_logprobs(model, prompts, gens, temperature)):
        assert len(g.logprobs) == len(g.token_ids) > 0
        ratio = torch.exp(torch.tensor(g.logprobs) - ref)
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)


def right_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask of token rows, right-padded to the longest."""
    ids = torch.full((len(rows), max(map(len, rows))), pad)
    attn = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
    return ids, attn


def test_learner_logprobs_equal_behaviour_logprobs(tiny):
    """The update's recomputation (right-padded rows, loss positions only) gives ratio 1."""
    model, tok, prompts = tiny
    gens = sample(tiny, GenParams(8))
    rows = [p + g.token_ids for p, g in zip(prompts, gens)]
    ids, attn = right_padded(rows, tok.pad_token_id)
    width = ids.shape[1]
    needed = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    old = torch.zeros((len(rows), width - 1))
    for i, (p, g, row) in enumerate(zip(prompts, gens, rows)):
        needed[i, len(p) - 1 : len(row) - 1] = True
        old[i, len(p) - 1 : len(row) - 1] = torch.tensor(g.logprobs)
    with torch.no_grad():
        full, ent_full = token_logprobs(model, ids, attn, torch.ones(len(rows)), with_entropy=True)
        only, ent_only = token_logprobs(model, ids, attn, torch.ones(len(rows)), with_entropy=True, needed=needed)
    assert torch.allclose(full[needed], old[needed], atol=1e-5)
    assert torch.allclose(only, torch.where(needed, full, 0.0), atol=1e-6)
    assert torch.allclose(ent_only, torch.where(needed, ent_full, 0.0), atol=1e-6)


def test_greedy_equals_transformers_generate(tiny):
    model, tok, prompts = tiny
    gens = sample(tiny, GenParams(8, greedy=True), prompts=prompts[: len(TEXTS)])
    for p, g in zip(prompts, gens):
        ref = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(p) :].tolist()
        assert g.token_ids == ref


def test_eos_ends_a_row_and_length_caps_it(tiny):
    model, tok, prompts = tiny
    first = sample(tiny, GenParams(1, greedy=True))[0].token_ids[0]
    # declare the first greedy token the EOS: that row must stop right there
    gens = sample(tiny, GenParams(6, greedy=True), eos_id=first)
    assert gens[0].token_ids == [first] and gens[0].finish_reason == "stop"
    for g in sample(tiny, GenParams(5)):
        assert 1 <= len(g.token_ids) <= 5
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == tok.eos_token_id
        else:
            assert g.finish_reason == "length" and len(g.token_ids) == 5
        assert tok.eos_token_id not in g.token_ids[:-1]
    assert all(len(g.token_ids) == 1 for g in sample(tiny, GenParams(1)))


def test_stop_strings_truncate_at_first_occurrence(tiny):
    _, tok, _ = tiny
    plain = sample(tiny, GenParams(8))
    # pick a character some completion produces after its first token, and stop on it
    row = next(i for i, g in enumerate(plain) if len(tok.decode(g.token_ids, skip_special_tokens=True)) >= 2)
    stop = tok.decode(plain[row].token_ids, skip_special_tokens=True)[1]
    stopped = sample(tiny, GenParams(8, stop_strings=(stop,)))
    for a, b in zip(plain, stopped):
        assert a.token_ids[: len(b.token_ids)] == b.token_ids  # same draws, cut earlier or not at all
        text = tok.decode(b.token_ids, skip_special_tokens=True)
        if stop in text:
            assert b.finish_reason == "stop" and stop not in tok.decode(b.token_ids[:-1], skip_special_tokens=True)
        else:
            assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
    assert stopped[row].finish_reason == "stop"
    assert len(tok.decode(stopped[row].token_ids, skip_special_tokens=True)) <= 2  # stop was its 2nd character


def test_seeded_generator_is_deterministic(tiny):
    a, b, c = (sample(tiny, GenParams(8), seed=s) for s in (3, 3, 4))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_compaction_does_not_change_results(tiny):
    runs = [sample(tiny, GenParams(8), compact_below=f) for f in (0.0, 0.75, 1.0)]
    for other in runs[1:]:
        assert [g.token_ids for g in other] == [g.token_ids for g in runs[0]]
        assert [g.finish_reason for g in other] == [g.finish_reason for g in runs[0]]
        for x, y in zip(other, runs[0]):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-6)


def test_transformers_forward_path_gives_the_same_samples(tiny, monkeypatch):
    fast = sample(tiny, GenParams(8))
    monkeypatch.setattr(rollout.FastLM, "wrap", staticmethod(lambda model: None))
    slow = sample(tiny, GenParams(8))
    assert [g.token_ids for g in slow] == [g.token_ids for g in fast]
    for x, y in zip(slow, fast):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_tiny_top_p_is_greedy(tiny):
    greedy = sample(tiny, GenParams(8, greedy=True))
    nucleus = sample(tiny, GenParams(8, top_p=1e-6))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]


def test_rows_with_their_own_params_draw_what_each_params_draws_alone(tiny):
    """One call with per-row GenParams (greedy and sampled rows, other temperatures, token limits
    and stop strings): each row's completion is the one its own GenParams gives it in a call where
    every row has those settings, since a row's draws depend on its index only."""
    _, tok, prompts = tiny
    n = len(prompts)
    greedy, hot, cold = GenParams(8, greedy=True), GenParams(8, temperature=1.3), GenParams(8, temperature=0.6)
    plain = sample(tiny, GenParams(8))
    stop = next(tok.decode(g.token_ids, skip_special_tokens=True)[1] for g in plain
                if len(tok.decode(g.token_ids, skip_special_tokens=True)) >= 2)
    stopped = GenParams(8, stop_strings=(stop,))
    short = GenParams(3, temperature=1.3)
    nucleus = GenParams(8, top_p=1e-6)  # greedy by another road
    kinds = [greedy, hot, cold, stopped, short, nucleus]
    mixed = sample(tiny, [kinds[i % len(kinds)] for i in range(n)])
    alone = [sample(tiny, k) for k in kinds]
    for i, g in enumerate(mixed):
        want = alone[i % len(kinds)][i]
        assert g.token_ids == want.token_ids and g.finish_reason == want.finish_reason, i
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(want.logprobs), atol=1e-6)
    assert [mixed[i].token_ids for i in range(5, n, 6)] == [alone[0][i].token_ids for i in range(5, n, 6)]
    # the 3-token rows were cut at their own limit, in a call that went on to 8 tokens
    assert all(len(mixed[i].token_ids) <= 3 for i in range(4, n, len(kinds)))
    assert any(mixed[i].finish_reason == "length" and len(mixed[i].token_ids) == 3 for i in range(4, n, len(kinds)))
    assert max(len(g.token_ids) for g in mixed) == 8
    with pytest.raises(ValueError, match="one per prompt"):
        sample(tiny, [greedy, hot])


@pytest.mark.parametrize("family", ["llama-gqa", "qwen2-bias"])
def test_fast_forward_matches_transformers(family):
    """Grouped-query attention and q/k/v biases, on random weights, left- and right-padded."""
    torch.manual_seed(0)
    common = dict(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "llama-gqa":
        model = LlamaForCausalLM(LlamaConfig(**common)).eval()
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)).eval()
    assert FastLM.wrap(model) is not None
    wrapped = LlamaForCausalLM(LlamaConfig(**common)).eval()
    wrapped.model.layers[0].self_attn.q_proj = torch.nn.Sequential(wrapped.model.layers[0].self_attn.q_proj)
    assert FastLM.wrap(wrapped) is None  # e.g. LoRA: extra terms outside .weight, so transformers' forward
    ids = torch.randint(3, 50, (3, 9))
    for mask in (torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7]),
                 torch.tensor([[1] * 9, [0] * 4 + [1] * 5, [0] * 7 + [1] * 2])):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :-1], -1)
            ref = ref.gather(-1, ids[:, 1:, None]).squeeze(-1)
            ours, _ = token_logprobs(model, ids, mask, torch.ones(3))
        real = (mask[:, :-1] * mask[:, 1:]).bool()  # positions where a real token predicts a real token
        assert torch.allclose(ours[real], ref[real], atol=1e-5)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    gens = generate(model, prompts, GenParams(6, greedy=True), eos_id=0, pad_id=1)
    for p, g in zip(prompts, gens):
        ref = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=0, pad_token_id=1)
        assert g.token_ids == ref[0, len(p) :].tolist()


def test_shared_prefix_gradients_equal_per_row_gradients(tiny):
    """A group's rows share their prompt's states; the gradient must still be the per-row sum."""
    model, tok, prompts = tiny
    gens = sample(tiny, GenParams(6))
    ids, attn = right_padded([p + g.token_ids for p, g in zip(prompts, gens)], tok.pad_token_id)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(0)) * attn[:, 1:]

    def grads(logp):
        model.zero_grad()
        (logp * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    ours = grads(token_logprobs(model, ids, attn, torch.ones(ids.shape[0]))[0])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1]
    ref = grads(torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1))
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefix_gradients_are_the_same_bits_on_every_run():
    """Rows that share a prompt (a group's samples) read its states from one place; their gradient,
    summed into that place in the backward, must come out the same bits every time, on two threads
    too, or a real-model run does not repeat (indexing's backward adds repeated rows from several
    threads at once on the CPU). Shapes large enough for the threaded path: 8 groups of 8, their rows
    shuffled as the learner's minibatches are (a group's rows on both threads' halves)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(8):
        prompt = torch.randint(3, 64, (24,), generator=gen).tolist()
        rows += [prompt + torch.randint(3, 64, (int(n),), generator=gen).tolist()
                 for n in torch.randint(8, 40, (8,), generator=gen)]
    ids, attn = right_padded([rows[i] for i in torch.randperm(len(rows), generator=gen)], 0)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=gen) * attn[:, 1:]

    def grads():
        model.zero_grad()
        (token_logprobs(model, ids, attn, torch.ones(ids.shape[0]))[0] * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first, *again = [grads() for _ in range(4)]
    finally:
        torch.set_num_threads(threads)
    for other in again:
        assert all(torch.equal(a, b) for a, b in zip(first, other))


def _lora_llama(**lora_kw):
    """A random grouped-query Llama with LoRA on five projections, its B factors made non-zero."""
    from postrl.config.schema import LoraConfig
    from postrl.model.lora import apply_lora

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    cfg = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"], **lora_kw)
    model = apply_lora(model, cfg)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


class _PlainCall:
    """The model behind a wrapper no fast path recognises: the Hugging Face (peft) forward runs."""

    def __init__(self, model):
        self.model = model

    def __call__(self, **inputs):
        return self.model(**inputs)


def test_fast_forward_covers_lora_adapters_exactly_as_peft_runs_them():
    """Log-probs and the adapters' gradients as peft's own forward gives them; the reference is the
    base model (adapters off); sampling (the factors folded into the weights) decodes what peft's
    model generates. Without the adapters the log-probs would differ by far more than the tolerance."""
    from postrl.model.lora import make_reference

    model = _lora_llama()
    assert FastLM.wrap(model) is not None and FastLM.wrap(_PlainCall(model)) is None
    ids = torch.randint(3, 50, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7])
    real = (mask[:, :-1] * mask[:, 1:]).bool()
    calls = []
    hidden = FastLM.hidden

    def spy(self, *a, **k):
        calls.append(self.adapters)
        return hidden(self, *a, **k)

    def logp_and_grads(m):
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(m, ids, mask, torch.tensor([1.0, 0.7, 1.3]))
        (logp * real).sum().backward()
        return logp.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FastLM, "hidden", spy)
        ours, g_ours = logp_and_grads(model)
        with torch.no_grad():
            folded, _ = token_logprobs(model, ids, mask, torch.tensor([1.0, 0.7, 1.3]))
            ref_ours, _ = token_logprobs(make_reference(model), ids, mask, torch.tensor([1.0, 0.7, 1.3]))
    assert calls == [True, True, False]  # the policy (autograd, then folded) and the reference: all fused
    peft_logp, g_peft = logp_and_grads(_PlainCall(model))
    assert g_ours.keys() == g_peft.keys() and len(g_ours) == 2 * 5 * 2  # A and B, five projections, two layers
    torch.testing.assert_close(ours[real], peft_logp[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(folded[real], peft_logp[real], rtol=0, atol=1e-5)
    for name, g in g_peft.items():
        torch.testing.assert_close(g_ours[name], g, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad(), model.disable_adapter():
        ref_peft, _ = token_logprobs(_PlainCall(model), ids, mask, torch.tensor([1.0, 0.7, 1.3]))
    torch.testing.assert_close(ref_ours[real], ref_peft[real], rtol=0, atol=1e-5)
    assert float((ref_ours - ours)[real].abs().max()) > 0.05  # the adapters matter at this scale
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    gens = generate(model, prompts, GenParams(6, greedy=True), eos_id=0, pad_id=1)
    for p, g in zip(prompts, gens):
        want = model.generate(input_ids=torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=0,
                              pad_token_id=1)
        assert g.token_ids == want[0, len(p):].tolist()


def test_fast_forward_declines_lora_layers_it_cannot_reproduce():
    """Dropout while training, adapters merged into the weights: the Hugging Face forward runs."""
    model = _lora_llama(dropout=0.1)
    assert FastLM.wrap(model) is not None  # eval mode: dropout is the identity
    assert FastLM.wrap(model.train()) is None
    model = _lora_llama()
    model.get_base_model().model.layers[0].self_attn.q_proj.merge()
    assert FastLM.wrap(model) is None


def test_the_lora_benchmarks_peft_arm_really_runs_peft(monkeypatch):
    """benchmarks/lora_fused.py's `hf` arm: FastLM declines the LoRA model and its reference (the
    path LoRA took before it was fused), still runs a plain model, and is restored afterwards."""
    import sys
    from pathlib import Path

    from postrl.model.lora import make_reference

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    monkeypatch.delitem(sys.modules, "lora_fused", raising=False)
    import lora_fused

    model = _lora_llama()
    plain = LlamaForCausalLM(model.get_base_model().config).eval()
    undo = lora_fused.hf_for_lora()
    try:
        assert FastLM.wrap(model) is None and FastLM.wrap(make_reference(model)) is None
        assert FastLM.wrap(plain) is not None
    finally:
        undo()
    assert FastLM.wrap(model) is not None and FastLM.wrap(make_reference(model)) is not None
