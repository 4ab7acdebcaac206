"""The decode step on static shapes (postrl.sampling.graphs), run eagerly on the CPU: the same
tokens and log-probs as `generate`'s eager decode, bit for bit at the batch's own shapes, and to
float rounding at the captured ones; seeded; its weights following an update; `rollout.cuda_graphs`.
The CUDA capture itself is measured on a GPU (benchmarks/gpu_suite.py), not here."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.config.schema import RolloutConfig
from postrl.errors import ConfigError
from postrl.model.fastlm import FastLM
from postrl.sampling import graphs as graphs_module
from postrl.sampling.backends import make_backend
from postrl.sampling.generate import GenParams, generate
from postrl.sampling.graphs import DecodeGraphs

TEXTS = ["1+2=", "47+38=", "3=", "123+456+7=", "9*9=", "60-17="]


@pytest.fixture(scope="module", params=["tiny_model_dir", "head32_model_dir"])
def tiny(request):
    model, tok = load_model(str(request.getfixturevalue(request.param)), "float32", log=lambda *a: None)
    prompts = [tok(t)["input_ids"] for t in TEXTS] * 4  # 24 rows of 3 to 11 tokens
    return model, tok, prompts


def mixed(tok, n: int) -> list[GenParams]:
    """Greedy and sampled rows, other temperatures, top-p, a shorter limit, a stop string."""
    kinds = [GenParams(8, greedy=True), GenParams(8, temperature=1.3), GenParams(8, temperature=0.6),
             GenParams(8, top_p=0.8), GenParams(3, temperature=1.3), GenParams(8, stop_strings=("1",))]
    return [kinds[i % len(kinds)] for i in range(n)]


PARAMS = {"sampled": lambda tok, n: GenParams(8), "greedy": lambda tok, n: GenParams(8, greedy=True),
          "top_p": lambda tok, n: GenParams(8, temperature=0.7, top_p=0.7), "mixed": mixed}


def sample(tiny, params, seed=0, graphs=None, **kw):
    """(generations, the generator's state after the call)."""
    model, tok, prompts = tiny
    gen = torch.Generator().manual_seed(seed)
    out = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, gen,
                   decode=lambda ids: tok.decode(ids, skip_special_tokens=True), graphs=graphs, **kw)
    return out, gen.get_state()


def eager_static(model, **kw) -> DecodeGraphs:
    return DecodeGraphs(FastLM.wrap(model), capture=False, max_rows=512, **kw)


@pytest.mark.parametrize("kind", list(PARAMS))
def test_static_step_gives_the_eager_decodes_tokens_and_logprobs_bit_for_bit(tiny, kind):
    """At the batch's own shapes (exact: no padding rows, attention over the columns written), the
    static step's code path (static buffers, the column and positions as tensors advanced in the
    step, the key bias masked in the step, sampling inside it, compaction into new buffers) gives
    exactly today's floats."""
    model, tok, prompts = tiny
    params = PARAMS[kind](tok, len(prompts))
    want, want_state = sample(tiny, params)
    graphs = eager_static(model, exact=True)
    got, got_state = sample(tiny, params, graphs=graphs)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.logprobs for g in got] == [g.logprobs for g in want]  # float equality, no tolerance
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    assert torch.equal(got_state, want_state)  # the same draws, in the same order
    if kind == "mixed":  # the 3-token rows ended early: the batch was compacted into a smaller step
        assert len({rows for rows, _, _ in graphs.steps}) > 1


@pytest.mark.parametrize("kind", ["sampled", "mixed"])
def test_captured_shapes_give_the_same_tokens_and_logprobs_to_rounding(tiny, kind):
    """At the shapes a graph is captured with (rows padded to a power of two, attention over the
    whole cache with the unused columns masked), the CPU rounds differently: its sgemm takes
    another kernel below 8 rows, and a matmul or softmax over 256 columns sums in another order
    than over the columns written (see postrl.sampling.graphs' docstring). The tokens stay those of today's decode."""
    model, tok, prompts = tiny
    params = PARAMS[kind](tok, len(prompts))
    want, want_state = sample(tiny, params)
    graphs = eager_static(model)
    got, got_state = sample(tiny, params, graphs=graphs)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    assert torch.equal(got_state, want_state)
    diff = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs))
    assert diff < 2e-6
    assert all(rows & (rows - 1) == 0 and length == 256 for rows, length, _ in graphs.steps)
    assert (32, 256, kind == "mixed") in graphs.steps  # 24 rows in the 32-row bucket


def test_seeded_sampling_is_reproducible_through_the_static_step_and_replays_its_buckets(tiny):
    model, tok, prompts = tiny
    graphs = eager_static(model)
    a, _ = sample(tiny, GenParams(8), seed=3, graphs=graphs)
    made = dict(graphs.steps)
    b, _ = sample(tiny, GenParams(8), seed=3, graphs=graphs)
    assert graphs.steps == made  # the second call reused the first call's steps (buckets)
    c, _ = sample(tiny, GenParams(8), seed=4, graphs=graphs)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] != [g.token_ids for g in c]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    eager, _ = sample(tiny, GenParams(8), seed=3)
    assert [g.token_ids for g in eager] == [g.token_ids for g in a]


def test_static_step_weights_follow_an_optimizer_step_in_place(tiny):
    """A new policy version is copied into the storage the (captured) step reads: the fused q/k/v and
    gate/up tensors keep their storage and take the updated weights; the other weights are the
    model's parameters themselves."""
    model, tok, prompts = tiny
    model = copy.deepcopy(model)
    graphs = eager_static(model, exact=True)
    tiny = (model, tok, prompts)
    before, _ = sample(tiny, GenParams(8, greedy=True), graphs=graphs)
    fused = graphs.layers[0].qkv_w
    storage = fused.data_ptr()
    ids = torch.tensor([prompts[3]])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    attn = model.model.layers[0].self_attn
    new = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    assert not torch.equal(fused, new)  # the step has not seen the update yet
    after, _ = sample(tiny, GenParams(8, greedy=True), graphs=graphs)
    assert graphs.layers[0].qkv_w.data_ptr() == storage and torch.equal(graphs.layers[0].qkv_w, new)
    assert graphs.layers[0].o_w is attn.o_proj.weight
    eager, _ = sample(tiny, GenParams(8, greedy=True))
    assert [g.token_ids for g in after] == [g.token_ids for g in eager]
    assert [g.logprobs for g in after] == [g.logprobs for g in eager]
    assert [g.logprobs for g in after] != [g.logprobs for g in before]


def test_a_replaced_parameter_makes_the_steps_again_with_one_log_line(tiny, caplog):
    """A parameter replaced by a new tensor (not updated in place) is not the storage the steps read:
    they are made again on the new weights rather than read the old ones."""
    model, tok, prompts = tiny
    model = copy.deepcopy(model)
    tiny = (model, tok, prompts)
    graphs = eager_static(model, exact=True)
    sample(tiny, GenParams(8, greedy=True), graphs=graphs)
    norm = model.model.norm
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 3.0)
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        got, _ = sample(tiny, GenParams(8, greedy=True), graphs=graphs)
    assert len(caplog.records) == 1 and "replaced, not updated in place" in caplog.text
    assert graphs.outer[1] is norm.weight
    eager, _ = sample(tiny, GenParams(8, greedy=True))
    assert [g.logprobs for g in got] == [g.logprobs for g in eager]


def test_a_capture_that_fails_decodes_eagerly_under_auto_and_is_one_line_error_under_on(tiny, caplog, monkeypatch):
    """The capture has not yet run on a GPU: where it fails, `auto` keeps sampling (the same static
    steps eagerly, from the step whose capture failed on: the same floats as never capturing) with
    one warning, and `on` stops with one line naming the key and the failure."""
    model, tok, prompts = tiny

    def fails(self):
        raise RuntimeError("planted capture failure\nsecond line")

    monkeypatch.setattr(graphs_module.StaticStep, "_warm_or_capture", fails)
    params = PARAMS["mixed"](tok, len(prompts))
    want, want_state = sample(tiny, params, graphs=eager_static(model))
    auto = DecodeGraphs(FastLM.wrap(model), capture=True, max_rows=512)
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        got, got_state = sample(tiny, params, graphs=auto)
        again, _ = sample(tiny, params, graphs=auto)
    assert [g.token_ids for g in got] == [g.token_ids for g in want] == [g.token_ids for g in again]
    assert [g.logprobs for g in got] == [g.logprobs for g in want]
    assert torch.equal(got_state, want_state) and not auto.capture
    assert len(caplog.records) == 1 and "planted capture failure" in caplog.text and "runs eagerly" in caplog.text
    on = DecodeGraphs(FastLM.wrap(model), capture=True, max_rows=512, strict=True)
    with pytest.raises(ConfigError) as e:
        sample(tiny, params, graphs=on)
    assert str(e.value) == ("config key 'rollout.cuda_graphs' = 'on': the decode step could not be captured: "
                            "RuntimeError: planted capture failure")
    assert on.lock.acquire(blocking=False)  # the failed call freed the steps


def test_cuda_graphs_auto_is_off_on_the_cpu_with_one_log_line_and_on_is_a_one_line_error(tiny, caplog,
                                                                                         monkeypatch):
    model, tok, _ = tiny
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        assert make_backend(RolloutConfig(), model, tok).graphs is None  # auto is the default
    assert [r.getMessage() for r in caplog.records] == [
        "rollout.cuda_graphs: auto: the decode step runs eagerly: the model is on cpu, not a CUDA device"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        assert make_backend(RolloutConfig(cuda_graphs="off"), model, tok).graphs is None
    assert not caplog.records
    with pytest.raises(ConfigError) as err:
        make_backend(RolloutConfig(cuda_graphs="on"), model, tok)
    assert str(err.value) == "config key 'rollout.cuda_graphs' = 'on': the model is on cpu, not a CUDA device"
    monkeypatch.setattr(graphs_module.FastLM, "wrap", staticmethod(lambda model: None))
    with pytest.raises(ConfigError, match=r"^config key 'rollout.cuda_graphs' = 'on': the model does not run on "
                                          r"the fused FastLM path$"):
        make_backend(RolloutConfig(cuda_graphs="on"), model, tok)


def test_cuda_graphs_setting_is_validated_as_its_choices():
    # YAML reads on and off unquoted as booleans; the setting takes them as the words
    assert [load_config(None, [f"rollout.cuda_graphs={v}"]).rollout.cuda_graphs for v in ("on", "off", "auto")] == [
        "on", "off", "auto"]
    with pytest.raises(ConfigError, match=r"^config key 'rollout.cuda_graphs' = 'always': expected auto, on or off$"):
        load_config(None, ["rollout.cuda_graphs=always"])
    with pytest.raises(ConfigError, match=r"^config key 'rollout.cuda_graphs' = 1: expected auto, on or off$"):
        load_config(None, ["rollout.cuda_graphs=1"])


def test_a_call_above_the_largest_bucket_decodes_eagerly_with_one_log_line(tiny, caplog):
    model, tok, prompts = tiny
    graphs = DecodeGraphs(FastLM.wrap(model), capture=False, max_rows=16)
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        got, _ = sample(tiny, GenParams(8), graphs=graphs)
        sample(tiny, GenParams(8), graphs=graphs)
    assert not graphs.steps and len(caplog.records) == 1 and "more rows than the largest bucket (16)" in caplog.text
    assert [g.logprobs for g in got] == [g.logprobs for g in sample(tiny, GenParams(8))[0]]


def test_a_call_while_another_holds_the_steps_decodes_eagerly_and_the_steps_are_freed_after_each_call(tiny, caplog):
    model, tok, prompts = tiny
    graphs = eager_static(model)
    def fail(ids):
        raise RuntimeError("a stop-string check that fails mid-call")

    with pytest.raises(RuntimeError, match="mid-call"):  # the steps are freed all the same
        generate(model, prompts, GenParams(8, stop_strings=("x",)), tok.eos_token_id, tok.pad_token_id, decode=fail,
                 graphs=graphs)
    assert not graphs.lock.locked()
    sample(tiny, GenParams(8), graphs=graphs)
    assert not graphs.lock.locked() and graphs.steps
    made = dict(graphs.steps)
    graphs.lock.acquire()  # another thread's call, in flight
    with caplog.at_level(logging.INFO, logger="postrl.sampling.graphs"):
        got, _ = sample(tiny, GenParams(8, greedy=True), graphs=graphs)
    graphs.lock.release()
    assert "another one decodes through the steps" in caplog.text and graphs.steps == made
    assert [g.logprobs for g in got] == [g.logprobs for g in sample(tiny, GenParams(8, greedy=True))[0]]
