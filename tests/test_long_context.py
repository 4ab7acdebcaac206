"""Memory that grows gently with length: the chunked vocabulary head, packed sequences and
token-budget micro-batches compute what the plain computation computes.

Three forwards are covered: the tiny Llama through FastLM (full fine-tuning), the same model with
LoRA adapters through FastLM (the path SmolLM2 with LoRA takes), and with LoRA through its own
Hugging Face decoder (`lora-hf`: where FastLM does not cover the adapters, e.g. DoRA).
"""

from __future__ import annotations

import random

import pytest
import torch

from postrl.builtin_models import load_model
from postrl.config.schema import LoraConfig, ModelConfig, RLConfig, TrainConfig
from postrl.learner.learner import Learner
from postrl.model import logprobs as logprobs_mod
from postrl.model.fastlm import FastLM
from postrl.model.lora import apply_lora, make_reference
from postrl.records import Task
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy


def _model(tiny_model_dir, kind: str, monkeypatch=None):
    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    if kind == "lora-hf":  # as if FastLM did not cover the adapters: the Hugging Face decoder runs
        monkeypatch.setattr(FastLM, "wrap", classmethod(lambda cls, model, adapters=True: None))
    if kind in ("lora", "lora-hf"):
        torch.manual_seed(0)
        model = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        with torch.no_grad():  # non-zero adapters, so that leaving them out would show
            gen = torch.Generator().manual_seed(1)
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        assert (FastLM.wrap(model) is None) == (kind == "lora-hf") and logprobs_mod.hf_decoder_and_head(model) is not None
    return model.eval(), tok


def _rows(tok, n: int = 6, seed: int = 0):
    """Right-padded rows of uneven lengths, loss positions on each row's tail, temperatures."""
    rng = random.Random(seed)
    vocab = len(tok)
    rows = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 13))] for _ in range(n)]
    width = max(map(len, rows))
    ids = torch.full((n, width), tok.pad_token_id)
    attn = torch.zeros((n, width), dtype=torch.long)
    needed = torch.zeros((n, width - 1))
    for i, r in enumerate(rows):
        ids[i, : len(r)], attn[i, : len(r)] = torch.tensor(r), 1
        needed[i, len(r) // 2 - 1 : len(r) - 1] = 1  # the second half of the row is the "completion"
    return ids, attn, needed, torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 1.0][:n])


def _grads(model, logp, ent, w):
    model.zero_grad(set_to_none=True)
    ((logp * w).sum() + (ent * w.flip(0)).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["fastlm", "lora", "lora-hf"])
def test_chunked_logprobs_and_entropy_equal_the_full_computation(tiny_model_dir, kind, monkeypatch):
    model, tok = _model(tiny_model_dir, kind, monkeypatch)
    ids, attn, needed, temps = _rows(tok)
    vocab = model.config.vocab_size
    seen = []
    head = logprobs_mod._head_logprobs
    monkeypatch.setattr(logprobs_mod, "_head_logprobs", lambda lg, *a: (seen.append(lg.shape[0]), head(lg, *a))[1])
    tiny_chunk = 3 * 4 * vocab / 2**20  # three positions of float32 logits per chunk
    assert logprobs_mod.chunk_rows(vocab, tiny_chunk) == 3
    w = torch.randn(needed.shape, generator=torch.Generator().manual_seed(0)) * needed
    out = {}
    for name, mib in (("whole", 1e6), ("chunked", tiny_chunk)):
        seen.clear()
        logp, ent = logprobs_mod.token_logprobs(model, ids, attn, temps, with_entropy=True, entropy_grad=True,
                                                needed=needed, chunk_mib=mib)
        out[name] = (logp.detach(), ent.detach(), _grads(model, logp, ent, w), max(seen), len(seen))
    n = int(needed.sum())
    # forward chunks, then each chunk once more in its backward (recomputed, never kept)
    assert out["whole"][3:] == (n, 1) and out["chunked"][3] == 3 and out["chunked"][4] == 2 * -(-n // 3)
    torch.testing.assert_close(out["chunked"][0], out["whole"][0], rtol=0, atol=1e-6)
    torch.testing.assert_close(out["chunked"][1], out["whole"][1], rtol=0, atol=1e-6)
    assert out["whole"][2].keys() == out["chunked"][2].keys() and out["whole"][2]
    for name, g in out["whole"][2].items():
        torch.testing.assert_close(out["chunked"][2][name], g, rtol=1e-4, atol=1e-6, msg=name)
    # and both are the plain computation: a full log-softmax over the model's own logits
    with torch.no_grad():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1] / temps[:, None, None]
        full = torch.log_softmax(logits, -1)
        want = full.gather(-1, ids[:, 1:, None]).squeeze(-1) * needed
        want_ent = -(full.exp() * full).sum(-1) * needed
    torch.testing.assert_close(out["chunked"][0], want, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["chunked"][1], want_ent, rtol=0, atol=1e-5)


def test_the_logits_chunk_follows_the_device_unless_it_is_set(tiny_model_dir, monkeypatch):
    """model.logits_chunk_mib 0 (the default): 16 MiB on the CPU, 256 MiB on an accelerator, where
    16 MiB chunks held an H200's update at a fifth to a third of its speed; a value set is kept anywhere."""
    assert logprobs_mod.logits_chunk_mib(0, torch.device("cpu")) == logprobs_mod.LOGITS_CHUNK_MIB == 16
    assert logprobs_mod.logits_chunk_mib(0, torch.device("cuda", 0)) == logprobs_mod.ACCELERATOR_LOGITS_CHUNK_MIB
    assert logprobs_mod.logits_chunk_mib(4.0, torch.device("cuda")) == logprobs_mod.logits_chunk_mib(4.0, torch.device("cpu")) == 4.0
    model, tok = _model(tiny_model_dir, "fastlm", monkeypatch)
    ids, attn, needed, temps = _rows(tok)
    used = []
    monkeypatch.setattr(logprobs_mod, "chunk_rows", lambda vocab, mib: (used.append(mib), 3)[1])
    logprobs_mod.token_logprobs(model, ids, attn, temps, needed=needed)  # the default: this device's
    logprobs_mod.token_logprobs(model, ids, attn, temps, needed=needed, chunk_mib=2.5)
    assert used == [16, 2.5]


def test_a_small_vocabulary_fits_one_chunk_and_is_bitwise_the_unchunked_head(tiny_model_dir):
    """The default chunk holds every position of the tiny models: their runs are unchanged bit for bit."""
    model, tok = _model(tiny_model_dir, "fastlm")
    ids, attn, needed, temps = _rows(tok)
    assert logprobs_mod.chunk_rows(model.config.vocab_size, logprobs_mod.LOGITS_CHUNK_MIB) > 10_000
    with torch.no_grad():
        logp, ent = logprobs_mod.token_logprobs(model, ids, attn, temps, with_entropy=True, needed=needed)
        hidden, head = logprobs_mod._final_hidden(model, ids, attn, needed.bool())
        keep = needed.bool()
        want, want_ent = logprobs_mod._head_logprobs(head(hidden), ids[:, 1:][keep],
                                                     temps[:, None].expand(keep.shape)[keep], True, False)
    assert torch.equal(logp[keep], want) and torch.equal(ent[keep], want_ent)


@pytest.mark.parametrize("kind", ["fastlm", "lora", "lora-hf"])
def test_packed_rows_give_the_padded_logprobs_and_gradients(tiny_model_dir, kind, monkeypatch):
    """Packing changes no row: attention never crosses from one packed sequence into the next."""
    model, tok = _model(tiny_model_dir, kind, monkeypatch)
    ids, attn, needed, temps = _rows(tok)
    w = torch.randn(needed.shape, generator=torch.Generator().manual_seed(0)) * needed
    out = {}
    for pack in (False, True):
        logp, ent = logprobs_mod.token_logprobs(model, ids, attn, temps, with_entropy=True, entropy_grad=True,
                                                needed=needed, pack=pack)
        out[pack] = (logp.detach(), ent.detach(), _grads(model, logp, ent, w))
    torch.testing.assert_close(out[True][0], out[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=1e-5)
    for name, g in out[False][2].items():
        torch.testing.assert_close(out[True][2][name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the check can fail: a packed sequence run without the per-sequence boundaries (plain causal
    # attention over all rows) gives other log-probs for every row after the first
    packed = logprobs_mod.pack_rows(ids, attn)
    with torch.no_grad():
        leaky = model(input_ids=packed.ids, use_cache=False).logits[0]  # positions 0..N-1, one sequence
        at = packed.flat[:, :-1][needed.bool()]
        lsm = torch.log_softmax(leaky[at].float() / temps[:, None].expand(needed.shape)[needed.bool()][:, None], -1)
        leaked = lsm.gather(-1, ids[:, 1:][needed.bool()][:, None]).squeeze(-1)
    assert float((leaked - out[True][0][needed.bool()]).abs().max()) > 1e-2


def _samples(model, tok, n_tasks=3, n=4):
    tasks = [Task("t", f"t/{i}", f"{i}+{i * 7}=", "0") for i in range(n_tasks)]
    samples = Policy(model, tok).sample(tasks, n, GenParams(8), torch.Generator().manual_seed(0))
    for i, s in enumerate(samples):  # uneven completion lengths, both signs of advantage
        s.completion_ids, s.logprobs = s.completion_ids[: 2 + i % 7], s.logprobs[: 2 + i % 7]
    return samples


def _update_grads(tiny_model_dir, kind, train_kw, model_kw=None, monkeypatch=None):
    model, tok = _model(tiny_model_dir, kind, monkeypatch)
    samples = _samples(model, tok)
    policy = Policy(model, tok)
    train = TrainConfig(lr=1e-2, minibatches=1, max_grad_norm=1e9, samples_per_prompt=4, **train_kw)
    learner = Learner(policy, make_reference(model), train, RLConfig(kl_coef=0.1, entropy_coef=0.01),
                      ModelConfig(**(model_kw or {})))
    batch = learner.build_batch(samples, 0.1)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])
    stats = learner.update(batch, kl_coef=0.1, generator=torch.Generator().manual_seed(0))
    return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["fastlm", "lora", "lora-hf"])
def test_packed_update_loss_equals_the_padded_update_loss(tiny_model_dir, kind, monkeypatch):
    padded, g_padded = _update_grads(tiny_model_dir, kind, {}, monkeypatch=monkeypatch)
    packed, g_packed = _update_grads(tiny_model_dir, kind, {"pack_sequences": True, "max_tokens_per_microbatch": 40},
                                     monkeypatch=monkeypatch)
    for key in ("loss", "pg_loss", "kl_mean", "entropy"):
        assert getattr(packed, key) == pytest.approx(getattr(padded, key), rel=1e-5, abs=1e-7), key
    assert g_padded.keys() == g_packed.keys() and g_padded
    for name, g in g_padded.items():
        torch.testing.assert_close(g_packed[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_token_budget_cuts_micro_batches_by_forward_tokens(tiny_model_dir):
    model, tok = _model(tiny_model_dir, "fastlm")
    lengths = [5, 3, 8, 2, 2]
    attn = torch.zeros(5, 8, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    rows = torch.arange(5)

    def cut(micro_batch_size=0, **train):
        learner = Learner(Policy(model, tok), None, TrainConfig(**train), RLConfig(kl_coef=0.0),
                          ModelConfig(micro_batch_size=micro_batch_size))
        return [m.tolist() for m in learner._micro_batches(rows, attn)]

    # padded: rows x longest row; a row over the budget (8 > 7) is a micro-batch of its own
    assert cut(max_tokens_per_microbatch=8) == [[0], [1], [2], [3, 4]]
    assert cut(max_tokens_per_microbatch=7) == [[0], [1], [2], [3, 4]]
    assert cut(max_tokens_per_microbatch=10) == [[0, 1], [2], [3, 4]]
    # packed: the rows' real tokens
    assert cut(max_tokens_per_microbatch=8, pack_sequences=True) == [[0, 1], [2], [3, 4]]
    assert cut(max_tokens_per_microbatch=100, pack_sequences=True) == [[0, 1, 2, 3, 4]]
    # with model.micro_batch_size as well, whichever limit comes first
    assert cut(micro_batch_size=2, max_tokens_per_microbatch=100, pack_sequences=True) == [[0, 1], [2, 3], [4]]
    assert cut(micro_batch_size=2) == [[0, 1], [2, 3], [4]]  # no budget: by count alone, as before


def test_token_budget_micro_batches_keep_the_minibatch_gradient(tiny_model_dir):
    whole, g_whole = _update_grads(tiny_model_dir, "fastlm", {})
    budget, g_budget = _update_grads(tiny_model_dir, "fastlm", {"max_tokens_per_microbatch": 30})
    assert budget.loss == pytest.approx(whole.loss, rel=1e-5)
    for name, g in g_whole.items():
        torch.testing.assert_close(g_budget[name], g, rtol=1e-4, atol=1e-6, msg=name)


GPU_STEP_PACKAGES = ("postrl.model", "postrl.sampling", "postrl.learner")


def test_gpu_step_imports_only_torch_transformers_and_the_model_packages_and_runs_small():
    """benchmarks/gpu_step.py runs where only torch, transformers and postrl's model, sampling and
    learner packages are available: importing it must not load any other postrl module."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = repo / "benchmarks" / "gpu_step.py"
    tree = ast.parse(script.read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    froms = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert top <= {"argparse", "time", "torch"}
    assert {m for m in froms if m != "__future__"} <= {"transformers"} | {m for m in froms if m.startswith(GPU_STEP_PACKAGES)}
    probe = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_step; "
             "print(sorted(m for m in sys.modules if m.startswith('postrl')))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=repo, capture_output=True, text=True, check=True)
    names = eval(loaded.stdout.strip().splitlines()[-1])
    assert names and all(m == "postrl" or m.startswith(GPU_STEP_PACKAGES) for m in names), names
    run = subprocess.run([sys.executable, str(script), "--device", "cpu", "--small", "--models", "smollm2-135m",
                          "--batch", "2", "--prompt-tokens", "4", "--new-tokens", "4", "--peak-seconds", "0.1"],
                         cwd=repo, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = run.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT ") and "smollm2-135m:sample_tok_s=" in result
    mismatch = float(result.split("mismatch_max=")[1].split()[0])
    assert mismatch < 1e-4  # sampler and learner: one model, one forward
