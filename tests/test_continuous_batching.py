"""Continuous batching (`postrl.sampling.continuous`): with fewer slots than rows, the same completions
as one batch of every row (the same draws, the generator left in the same state), each row told once;
rows really take freed slots; the Hugging Face path keeps its chunks; Policy and the config switch it on."""

import logging
import random
import sys
from pathlib import Path

import pytest
import torch

from postrl.builtin_models import load_model
from postrl.config.schema import RolloutConfig
from postrl.records import Task
from postrl.sampling import continuous
from postrl.sampling.continuous import generate_slots
from postrl.sampling.generate import GenParams, generate
from postrl.sampling.policy import Policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import continuous_batching  # noqa: E402

TEXTS = ["1+2=", "47+38=", "3=", "123+456+7=", "9*9=", "60-17="]


@pytest.fixture(scope="module", params=["tiny_model_dir", "head32_model_dir"])
def tiny(request):
    model, tok = load_model(str(request.getfixturevalue(request.param)))
    prompts = [tok(t)["input_ids"] for t in TEXTS for _ in range(4)]  # groups of 4 sharing a prompt
    return model, tok, prompts


def skewed(n: int, seed: int = 0) -> list[GenParams]:
    """Most rows short (their own small limits, some stop strings), a few at 40 tokens."""
    rnd = random.Random(seed)
    return [GenParams(rnd.choice([1, 2, 3, 4, 40]) if i % 5 else 40, temperature=rnd.choice([1.0, 0.7]),
                      greedy=rnd.random() < 0.2, stop_strings=("1",) if rnd.random() < 0.3 else ())
            for i in range(n)]


def run(tiny, params, slots=None, seed=5, eos_id=None, **kw):
    """(generations, the generator's state after, how often on_done told each row)."""
    model, tok, prompts = tiny
    gen, told = torch.Generator().manual_seed(seed), {}

    def on_done(rows, gens):
        for r in rows:
            told[r] = told.get(r, 0) + 1

    args = (model, prompts, params, tok.eos_token_id if eos_id is None else eos_id, tok.pad_token_id, gen,
            lambda ids: tok.decode(ids, skip_special_tokens=True))
    gens = generate(*args, on_done=on_done, **kw) if slots is None else generate_slots(*args, slots=slots,
                                                                                        on_done=on_done, **kw)
    return gens, gen.get_state(), told


def assert_same(a, b):
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["skewed rows", "sampled", "greedy"])
@pytest.mark.parametrize("slots", [2, 7])
def test_few_slots_give_one_batchs_completions_and_leave_the_generator_where_it_left_it(tiny, kind, slots):
    n = len(tiny[2])
    params = {"skewed rows": skewed(n), "sampled": GenParams(20), "greedy": GenParams(20, greedy=True)}[kind]
    whole, state, _ = run(tiny, params)
    slotted, slotted_state, told = run(tiny, params, slots=slots)
    assert_same(slotted, whole)
    assert torch.equal(slotted_state, state)  # the same draws, as many: later calls draw the same
    assert told == dict.fromkeys(range(n), 1)  # every row told once
    lengths = [len(g.token_ids) for g in whole]
    if kind != "greedy":  # rows end at different steps (EOS, stop strings, limits): slots free mid-call
        assert len(set(lengths)) > 2
    if kind == "skewed rows":
        assert {g.finish_reason for g in whole} == {"stop", "length"}


def test_a_row_takes_a_freed_slot_so_short_rows_cost_no_steps_beside_a_long_one(tiny, monkeypatch):
    """Slots 2, one row of 30 tokens and twelve of 2 (no EOS): the short rows pass through the
    second slot one after another while the long row decodes (each joins as the last one ends and
    draws its first token from its prompt's logits), so the call takes the long row's 29 decode
    steps; chunks of 2 rows take 29 + 6."""
    model, tok, prompts = tiny
    params = [GenParams(30)] + [GenParams(2)] * 12
    steps = []
    step = continuous._SlotCache.step
    monkeypatch.setattr(continuous._SlotCache, "step", lambda self, *a: steps.append(len(self.start)) or step(self, *a))
    prompts13 = prompts[:13]
    whole, state, _ = run((model, tok, prompts13), params, eos_id=-1)
    slotted, slotted_state, _ = run((model, tok, prompts13), params, slots=2, eos_id=-1)
    assert_same(slotted, whole)
    assert torch.equal(slotted_state, state)
    assert [len(g.token_ids) for g in slotted] == [30] + [2] * 12
    assert len(steps) == 29
    assert steps[-1] == 1  # once nobody waits, the finished row's slot is dropped, as generate drops rows


def test_the_cache_moves_its_live_columns_back_and_the_completions_hold(tiny, monkeypatch):
    moves = []
    move = continuous._SlotCache._move_back
    monkeypatch.setattr(continuous._SlotCache, "_move_back", lambda self: moves.append(self.col) or move(self))
    twelve = (*tiny[:2], tiny[2][::2])
    whole, _, _ = run(twelve, GenParams(30), eos_id=-1)
    slotted, _, _ = run(twelve, GenParams(30), slots=2, eos_id=-1)  # 12 rows x 30 tokens through 2 slots
    assert len(moves) >= 3
    assert_same(slotted, whole)


def test_the_transformers_path_runs_in_chunks_as_without_continuous_batching(tiny, monkeypatch, caplog):
    model, tok, prompts = tiny
    params = skewed(len(prompts))
    monkeypatch.setattr(continuous.FastLM, "wrap", staticmethod(lambda model: None))  # generate's class too
    gen = torch.Generator().manual_seed(5)
    chunks = []
    for start in range(0, len(prompts), 5):
        chunks += generate(model, prompts[start : start + 5], params[start : start + 5], tok.eos_token_id,
                           tok.pad_token_id, gen, lambda ids: tok.decode(ids, skip_special_tokens=True))
    with caplog.at_level(logging.INFO, logger="postrl.sampling.continuous"):
        slotted, state, told = run(tiny, params, slots=5)
    assert [g.token_ids for g in slotted] == [g.token_ids for g in chunks]
    assert [g.logprobs for g in slotted] == [g.logprobs for g in chunks]
    assert torch.equal(state, gen.get_state())
    assert told == dict.fromkeys(range(len(prompts)), 1)
    assert "run in chunks of 5" in caplog.text


def policy_samples(tiny, max_batch, on: bool, temperatures=None):
    model, tok, _ = tiny
    policy = Policy(model, tok, max_batch, rollout=RolloutConfig(continuous_batching=on))
    tasks = [Task("arith", str(i), t, "") for i, t in enumerate(TEXTS)]
    ready = []
    samples = policy.sample(tasks, 4, GenParams(12), torch.Generator().manual_seed(1), temperatures=temperatures,
                            on_ready=lambda s: ready.extend(x.group for x in s))
    return samples, ready


def test_policy_with_continuous_batching_samples_what_one_batch_samples_and_off_keeps_its_chunks(tiny):
    one_batch, _ = policy_samples(tiny, 512, on=False)
    slotted, ready = policy_samples(tiny, 5, on=True)
    chunked, _ = policy_samples(tiny, 5, on=False)
    assert [s.completion_ids for s in slotted] == [s.completion_ids for s in one_batch]
    for x, y in zip(slotted, one_batch):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    assert sorted(ready) == sorted([g for g in range(len(TEXTS)) for _ in range(4)])  # each group handed on once
    # off, a call larger than max_batch still runs in chunks, each drawing after the last: other draws
    assert [s.completion_ids for s in chunked] != [s.completion_ids for s in one_batch]
    # on, a call within the slots is the engine without continuous batching, bit for bit
    within, _ = policy_samples(tiny, 512, on=True)
    assert [(s.completion_ids, s.logprobs) for s in within] == [(s.completion_ids, s.logprobs) for s in one_batch]


def test_policy_takes_its_slots_from_rollout_max_num_seqs_unless_given(tiny):
    model, tok, _ = tiny
    assert Policy(model, tok, rollout=RolloutConfig(max_num_seqs=7)).max_batch == 7
    policy = Policy(model, tok, 3, rollout=RolloutConfig(continuous_batching=True, max_num_seqs=7))
    assert policy.max_batch == 3 and policy.backend.slots == 3
    assert Policy(model, tok, 3).backend.slots is None


def test_the_benchmarks_quick_run_prints_its_result_line(capsys):
    """benchmarks/continuous_batching.py --quick: the three arms on a few rows, in seconds."""
    assert continuous_batching.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "chunks" in out and "continuous" in out and "one batch" in out
    assert out.strip().splitlines()[-1].startswith("RESULT continuous_batching_speedup=")
