"""What a recipe costs on given hardware: one training step phase by phase, memory per rank, the run.

    hw = hardware("h100-sxm")                   # a GPU preset | "cpu" (measured now) | "custom:tflops=T,tbps=B,gib=G"
    model, tok = model_facts(cfg)               # the recipe's model from its config and tokenizer: no weights read
    work = workload(cfg, tok)                   # the step's shape; prompt length measured on the recipe's tasks
    host = host_times(cfg, model, work, tok, on_cpu=not hw.accelerator)   # what the formulas leave out, timed
    step = step_cost(cfg, model, work, hw, host)
    mem = memory_per_rank(cfg, model, work, cfg.model.lora, ranks=4, sharded=True)

With P the decoder's matmul weights, V x d the vocabulary head, R = prompts x samples completions of
c tokens (at most C = max_new_tokens) after prompts of p tokens, at the FLOP/s and bytes/s the
hardware reaches:
  sampling   prefill 2 P p per distinct prompt; each of the C - 1 decode steps the larger of its
             FLOPs, 2 (P + Vd) per live row, and its bytes, every weight once plus the live rows'
             KV cache;
  reference  2 P per decoder token, 2 Vd per completion token through the head;
  update     per token 6 P with every weight trained (forward, input and weight gradients), 4 P with
             LoRA (frozen weights get no weight gradient) plus 6 per adapter weight, 2 P more with
             gradient checkpointing; the head's chunks are recomputed in the backward (8 Vd, LoRA 6 Vd);
  sync       2 x weight bytes / bandwidth, where the sampler holds its own copy of the weights.
What the formulas leave out (Python, dispatch, the KV cache's bookkeeping; on a CPU also attention
and the vocabulary's work) is timed on a copy of the model 16 wide, and added to the device's time
on a CPU, overlapped with it on a GPU. docs/hardware.md has the formulas and their assumptions.

What it does not know: the model's answers (completions run to max_new_tokens unless a mean length
is given, and a group's samples are taken as all different), data parallelism's speed-up and its
all-reduce, vLLM's own kernels (sampling is modelled as postrl's engine), multi-turn episodes.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from postrl.config.schema import Config, LoraConfig
from postrl.errors import UserError
from postrl.model.fastlm import COVERED
from postrl.model.logprobs import chunk_rows, logits_chunk_mib

GIB = 2**30
GPU_FLOPS_SHARE = 0.4
"""Share of a GPU's dense bf16 peak the model's matmuls are assumed to reach: large dense models'
training runs report 35-50%; small models reach less. No GPU figure here is measured."""
GPU_BANDWIDTH_SHARE = 0.7
"""Share of a GPU's datasheet bandwidth that a decode step's reads (weights, KV cache) are assumed to reach."""
HOST_WIDTH = 16
"""Hidden and MLP width of the model copy that times the step's work that is not a weight matmul
(the hidden width rounded up to a multiple of the heads): its matmuls are ~1% of SmolLM2-135M's."""
HOST_DECODE_STEPS = 16
"""Decode steps the copy times (fewer when max_new_tokens is): the figure is per step."""
VOCAB_PASSES = 8
"""float32 passes over a position's logits: in sampling the draw's log-softmax, exp, cumulative sum
and search; in the learner the chunked head's logits, log-sum-exp and the gathered token (and, in
the update, their recomputation and gradients: twice that)."""
ACTIVATION_VALUES = (8, 4)
"""Values kept for the backward per token and layer: 8 x hidden (norms, q/k/v, attention output,
residuals) + 4 x intermediate (gate, up, their product, the down input)."""


@dataclass(frozen=True)
class GpuPreset:
    tflops: float
    """Dense bf16 tensor-core TFLOP/s (the datasheets' 'with sparsity' figures are twice these)."""
    tbps: float
    """Memory bandwidth, TB/s."""
    gib: float
    """Memory, as the datasheet gives it."""
    device_name: str
    """A part of the name `torch.cuda.get_device_name` gives it; the first preset whose part matches wins."""
    source: str
    """The NVIDIA datasheet or product page the figures come from."""


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
GPU_PRESETS: dict[str, GpuPreset] = {  # ordered: "H100 PCIe" before "H100", "L40S" before "L4"
    "h200": GpuPreset(989.0, 4.8, 141, "H200", "https://www.nvidia.com/en-us/data-center/h200/"),
    "h100-pcie": GpuPreset(756.0, 2.0, 80, "H100 PCIe", _H100),
    "h100-sxm": GpuPreset(989.0, 3.35, 80, "H100", _H100),
    "a100-80gb": GpuPreset(312.0, 2.039, 80, "A100",  # SXM; the PCIe part: 1.935 TB/s, the 40 GB: 1.555
                           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "l40s": GpuPreset(362.05, 0.864, 48, "L40S", "https://www.nvidia.com/en-us/data-center/l40s/"),
    "l4": GpuPreset(121.0, 0.3, 24, "L4", "https://www.nvidia.com/en-us/data-center/l4/"),
}


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float
    """Dense matmul FLOP/s: a GPU's datasheet bf16 figure, or the CPU's float32 rate measured now."""
    flops_share: float
    """Share of peak_flops the model's matmuls reach: assumed on a GPU, 1 on the CPU (measured)."""
    bandwidth: float
    """Memory bytes/s: the datasheet's, or the CPU's copy bandwidth measured now."""
    bandwidth_share: float
    memory_gib: float
    accelerator: bool
    """A device the host queues work on: host and device time overlap. On the CPU the host is the
    device, and they add up."""
    source: str
    shape_shares: dict[str, float] = field(default_factory=dict)
    """Share of peak_flops that matmuls of a kind reach where measured apart (on the CPU, at the
    step's own shapes, `matmul_shapes`): "decode", a decode step's few rows through the MLP, and
    "head", a few dozen rows through the vocabulary head; a kind not measured: flops_share."""

    @property
    def flops(self) -> float:
        return self.peak_flops * self.flops_share

    def rate(self, kind: str) -> float:
        """FLOP/s of `kind`'s matmuls (`shape_shares`)."""
        return self.peak_flops * self.shape_shares.get(kind, self.flops_share)

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth * self.bandwidth_share


def hardware(name: str, threads: int = 0, shapes: dict[str, tuple[int, int, int]] | None = None,
             dtype: str = "float32") -> Hardware:
    """`name`: a GPU preset, `cpu` (this machine's CPU, measured now in `dtype` with `threads` torch
    threads, 0 = torch's default, and at `shapes`, rows x in x out by kind, `matmul_shapes`) or
    `custom:tflops=T,tbps=B,gib=G` (dense bf16 TFLOP/s, TB/s, GiB)."""
    if name == "cpu":
        return probe_cpu(threads, shapes or {}, dtype)
    if name.startswith("custom:"):
        return _custom(name)
    if name not in GPU_PRESETS:
        raise UserError(f"unknown hardware {name!r}: one of cpu, {', '.join(GPU_PRESETS)}, or custom:tflops=T,tbps=B,gib=G")
    p = GPU_PRESETS[name]
    return Hardware(name, p.tflops * 1e12, GPU_FLOPS_SHARE, p.tbps * 1e12, GPU_BANDWIDTH_SHARE, p.gib, True, p.source)


def _custom(spec: str) -> Hardware:
    fields: dict[str, float] = {}
    for part in spec.removeprefix("custom:").split(","):
        key, _, value = part.partition("=")
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            fields[key.strip()] = math.nan
    if set(fields) != {"tflops", "tbps", "gib"} or not all(v > 0 for v in fields.values()):
        raise UserError(f"malformed hardware {spec!r}: custom:tflops=T,tbps=B,gib=G takes three positive numbers "
                        f"(dense bf16 TFLOP/s, memory TB/s, memory GiB); the others: cpu, {', '.join(GPU_PRESETS)}")
    return Hardware(spec, fields["tflops"] * 1e12, GPU_FLOPS_SHARE, fields["tbps"] * 1e12, GPU_BANDWIDTH_SHARE,
                    fields["gib"], True, "given on the command line")


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """torch's intra-op threads set to `n` inside the block (0: left as they are); yields the count."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def check_hardware(name: str) -> None:
    """The one-line error `hardware` gives for `name`, before anything slow runs."""
    if name != "cpu":
        hardware(name)


def probe_cpu(threads: int = 0, shapes: dict[str, tuple[int, int, int]] | None = None, dtype: str = "float32",
              seconds: float = 1.5) -> Hardware:
    """This machine's CPU, measured now in about `seconds`: `dtype` matmul FLOP/s of 1024-wide
    squares and of each of `shapes` (rows x in x out), and copy bandwidth (64 MiB, read and write
    counted), with the run's torch threads. The kinds are timed in turns, so that a slow spell of a
    shared machine falls on all of them, and each figure is the median of its repeats, not the best:
    a sustained rate under whatever loads the machine now."""
    shapes = {"square": (1024, 1024, 1024), **(shapes or {})}
    element = getattr(torch, dtype)
    operands = {kind: (torch.randn(rows, inner, dtype=element), torch.randn(inner, out, dtype=element))
                for kind, (rows, inner, out) in shapes.items()}
    src = torch.ones(16 * 2**20)
    dst = torch.empty_like(src)
    work = {kind: (lambda a=a, b=b: torch.mm(a, b)) for kind, (a, b) in operands.items()}
    with torch_threads(threads) as n:
        times = _median_times({**work, "copy": lambda: dst.copy_(src)}, seconds)
    rates = {kind: 2 * math.prod(shape) / times[kind] for kind, shape in shapes.items()}
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return Hardware("cpu", rates["square"], 1.0, 2 * src.numel() * 4 / times["copy"], 1.0, ram_gib, False,
                    f"measured now, {n} torch thread{'s' if n > 1 else ''}, {os.cpu_count()} cores",
                    {kind: rate / rates["square"] for kind, rate in rates.items() if kind != "square"})


def _median_times(work: dict[str, Callable[[], object]], seconds: float, block: float = 0.05) -> dict[str, float]:
    """Median seconds of each of `work`'s calls, run in turns for `seconds` (3 rounds at least):
    each turn repeats one call for `block` seconds and keeps all but its first time, since a call
    after another kind of work waits for the threads to wake, which back-to-back work does not."""
    times: dict[str, list[float]] = {name: [] for name in work}
    end, rounds = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or rounds < 3:
        rounds += 1
        for name, fn in work.items():
            fn()
            stop = time.perf_counter() + block
            while time.perf_counter() < stop or len(times[name]) < rounds:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


# ---------------------------------------------------------------------------- the model and the step's shape


@dataclass(frozen=True)
class ModelFacts:
    params: int
    """Every parameter, embeddings and norms included (a tied head counted once)."""
    matmul: int
    """The decoder layers' linear weights: 2 FLOPs per weight per token, forward."""
    head: int
    """vocab x hidden: the vocabulary head's matmul (the embedding matrix itself when tied)."""
    linears: tuple[tuple[str, int, int], ...]
    """(module name, in features, out features) of every decoder linear layer: LoRA's targets."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    config: object
    """The model's Hugging Face config (the host measurement builds a narrow copy from it)."""

    def adapters(self, lora: LoraConfig) -> int:
        """Weights of LoRA adapters `lora` adds: r x (in + out) per targeted linear layer."""
        if lora.r <= 0:
            return 0
        return sum(lora.r * (i + o) for name, i, o in self.linears if name.rsplit(".", 1)[-1] in lora.target_modules)

    def fused(self, lora: LoraConfig) -> bool:
        """Whether postrl's fused forward runs it (Llama family; with LoRA, adapters without dropout),
        which computes a group's shared prompt once in the learner's passes and samples with the
        adapters folded into the weights; otherwise every row is padded whole."""
        return getattr(self.config, "model_type", None) in COVERED and (lora.r <= 0 or lora.dropout == 0)

    def attention_flops(self, tokens: float, context: float) -> float:
        """Forward FLOPs of attention for `tokens` tokens at mean `context`: scores and values."""
        return 4 * self.layers * context * self.heads * self.head_dim * tokens

    @property
    def vocab_bytes(self) -> int:
        """Bytes each position's work over the vocabulary moves: VOCAB_PASSES float32 passes."""
        return VOCAB_PASSES * 4 * self.vocab

    def kv_bytes(self, dtype_bytes: int) -> int:
        """KV cache bytes per token of context."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def model_facts(cfg: Config) -> tuple[ModelFacts, object]:
    """(ModelFacts, tokenizer) of the recipe's model, from its config: the model is built on the
    meta device, so no weight is read or allocated (a GGUF file's metadata still takes seconds)."""
    from transformers import AutoModelForCausalLM

    from postrl.builtin_models import load_config_and_tokenizer

    config, tok = load_config_and_tokenizer(cfg.model.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    linears = tuple((name, m.in_features, m.out_features) for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and m is not head)
    heads = config.num_attention_heads
    facts = ModelFacts(
        params=sum(p.numel() for p in model.parameters()), matmul=sum(i * o for _, i, o in linears),
        head=head.weight.numel(), linears=linears, layers=config.num_hidden_layers, hidden=config.hidden_size,
        intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads, vocab=config.vocab_size,
        config=config)
    return facts, tok


@dataclass(frozen=True)
class Workload:
    prompts: int
    """Distinct prompts per step (train.prompts_per_step)."""
    samples: int
    """Completions per prompt (train.samples_per_prompt)."""
    prompt_tokens: float
    """Mean tokens of a prompt, chat template included."""
    new_tokens: int
    """max_new_tokens: the decode steps (the longest completion's) and the learner's padded width."""
    completion_tokens: float
    """Mean tokens of a completion (default new_tokens, the upper bound: every one to the limit)."""
    distinct_share: float = 1.0
    """Share of the completion tokens the fused forward computes over the whole batch (the
    reference pass): 1, every sample's completion its own; samples of a group that begin alike
    share those tokens' states."""
    minibatch_distinct_share: float = 1.0
    """The same within one minibatch of the update, whose rows are shuffled across minibatches."""

    @property
    def rows(self) -> int:
        return self.prompts * self.samples

    def body_tokens(self, fused: bool, minibatches: int = 0) -> float:
        """Tokens the decoder computes in a learner pass over the batch (`minibatches`: the
        update's, 0 for the whole batch at once): distinct prefixes when fused, a group's prompt
        once per minibatch holding one of its rows; else every row padded to the longest prompt
        and completion."""
        if not fused:
            return self.rows * (self.prompt_tokens + self.new_tokens)
        if not minibatches:
            return self.prompts * self.prompt_tokens + self.rows * self.completion_tokens * self.distinct_share
        # rows are shuffled: the chance a minibatch holds none of a group's samples, (1 - 1/m)^samples
        groups = minibatches * (1 - (1 - 1 / minibatches) ** self.samples)
        return (self.prompts * groups * self.prompt_tokens
                + self.rows * self.completion_tokens * self.minibatch_distinct_share)


def workload(cfg: Config, tok, prompt_tokens: float | None = None, completion_tokens: float | None = None,
             draws: int = 64) -> Workload:
    """The step's shape; the mean prompt length measured by encoding `draws` tasks drawn as the run
    draws them (domain weights; tools and episodes' later turns not counted), unless given."""
    if prompt_tokens is None:
        from postrl.curriculum.sampler import TaskSampler
        from postrl.sampling.policy import prompt_ids
        from postrl.tasks.catalog import build_domains

        tasks = TaskSampler(build_domains(cfg), cfg.seed, cfg.curriculum.domain_draw).next_batch(
            draws, {name: d.weight for name, d in cfg.domains.items()})
        prompt_tokens = statistics.mean(len(prompt_ids(tok, task)) for task in tasks)
    limit = cfg.train.max_new_tokens
    return Workload(cfg.train.prompts_per_step, cfg.train.samples_per_prompt, prompt_tokens, limit,
                    min(completion_tokens or limit, limit))


def matmul_shapes(cfg: Config, model: ModelFacts, work: Workload) -> dict[str, tuple[int, int, int]]:
    """Rows x in x out of the step's matmuls that run below the square ones' rate on a CPU: the
    batch (at most Policy's MAX_BATCH rows) through the MLP's first projection ("decode"), and at
    most a logits chunk's rows through the vocabulary head ("head")."""
    from postrl.sampling.policy import MAX_BATCH

    rows = min(work.rows, MAX_BATCH)
    chunk = chunk_rows(model.vocab, logits_chunk_mib(cfg.model.logits_chunk_mib, torch.device("cpu")))
    return {"decode": (rows, model.hidden, model.intermediate), "head": (min(rows, chunk), model.hidden, model.vocab)}


def micro_rows(cfg: Config, rows: int, width: float) -> int:
    """Rows of one of the learner's micro-batches out of `rows` of `width` tokens: at most
    model.micro_batch_size, and within train.max_tokens_per_microbatch (a row over it alone)."""
    size = cfg.model.micro_batch_size or rows
    if cfg.train.max_tokens_per_microbatch:
        size = min(size, max(1, int(cfg.train.max_tokens_per_microbatch // width)))
    return max(1, min(size, rows))


@dataclass(frozen=True)
class HostTimes:
    """Seconds of a step's work that the formulas leave out, measured now (`host_times`)."""

    decode_step: float
    """Per decode step of the step's sampling batch."""
    reference: float
    """The learner's batch building: the reference pass and the advantages."""
    update: float
    """The learner's update: every epoch and minibatch, forward, backward and optimiser."""


def host_times(cfg: Config, model: ModelFacts, work: Workload, tok, on_cpu: bool) -> HostTimes:
    """The step's work that is not in the formulas, timed now on a copy of the recipe's model whose
    hidden and MLP widths are HOST_WIDTH, with its layers and adapters: Python and op dispatch, the
    KV cache's bookkeeping. `on_cpu`: the copy keeps the attention heads and the vocabulary, and
    the time includes attention and each token's work over the vocabulary (the draw, the
    log-probs), whose small batched matmuls and single passes FLOPs and copy bandwidth do not
    predict on a CPU. For a GPU, where they are device work (counted in FLOPs and bytes), the copy
    has two heads of 8 and a vocabulary of HOST_WIDTH x 4: what is left is the host's share."""
    from transformers import AutoModelForCausalLM

    from postrl.model.lora import apply_lora

    heads, kv_heads, head_dim = (model.heads, model.kv_heads, model.head_dim) if on_cpu else (2, 2, 8)
    narrow = type(model.config).from_dict({
        **model.config.to_dict(), "hidden_size": heads * math.ceil(HOST_WIDTH / heads),  # a multiple of the heads
        "intermediate_size": HOST_WIDTH, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "vocab_size": model.vocab if on_cpu else 4 * HOST_WIDTH})
    torch.manual_seed(0)
    net = apply_lora(AutoModelForCausalLM.from_config(narrow).to(getattr(torch, cfg.model.dtype)), cfg.model.lora).eval()
    # a GPU's host launches kernels from one thread; on a CPU the run's threads do the work
    with torch_threads(cfg.run.threads if on_cpu else 1):
        return HostTimes(_decode_step_s(net, work, tok), *_learner_s(net, cfg, work, tok))


def _decode_step_s(net, work: Workload, tok) -> float:
    """Seconds per decode step of the step's batch (its distinct prompts x samples, no row ending
    early, each decoded as it ends), over at most HOST_DECODE_STEPS steps."""
    from postrl.sampling.generate import GenParams, generate

    rng = random.Random(0)
    length = max(1, round(work.prompt_tokens))
    vocab = net.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(work.prompts)]
    rows = [p for p in prompts for _ in range(work.samples)]

    def decoded(_rows: list[int], gens: list) -> None:  # as Policy turns each finished row into a Sample
        for g in gens:
            tok.decode(g.token_ids, skip_special_tokens=True)

    def sample(new: int) -> None:
        with torch.no_grad():
            generate(net, rows, GenParams(new), eos_id=-1, pad_id=0, generator=torch.Generator().manual_seed(0),
                     on_done=decoded)

    steps = min(work.new_tokens, HOST_DECODE_STEPS)
    return _steady_s(lambda: sample(steps)) / steps


def _learner_s(net, cfg: Config, work: Workload, tok) -> tuple[float, float]:
    """(build_batch, update) seconds of postrl's own learner on the step's batch: rows of a
    group's prompt and a completion of its own, to max_new_tokens, rewards alternating."""
    from postrl.learner.learner import Learner
    from postrl.model.lora import make_reference
    from postrl.records import Sample, Score, Task
    from postrl.sampling.policy import Policy

    rng, vocab, length = random.Random(0), net.config.vocab_size, max(1, round(work.prompt_tokens))
    samples = []
    for group in range(work.prompts):
        task, prompt = Task("cost", str(group), "", ""), [rng.randrange(1, vocab) for _ in range(length)]
        samples += [Sample(task, group, prompt, [rng.randrange(1, vocab) for _ in range(work.new_tokens)],
                           [-1.0] * work.new_tokens, "", "length", 1.0, 0, score=Score(float(j % 2), bool(j % 2)))
                    for j in range(work.samples)]
    reference = make_reference(net) if cfg.rl.kl_coef > 0 else None
    learner = Learner(Policy(net, tok), reference, cfg.train, cfg.rl, model_cfg=cfg.model)
    kl, built = cfg.rl.kl_coef, []
    build_s = _steady_s(lambda: built.append(learner.build_batch(samples, kl)))
    return build_s, _steady_s(lambda: learner.update(built[-1], kl, torch.Generator().manual_seed(0)))


def _steady_s(fn: Callable[[], object], budget: float = 2.0) -> float:
    """Median seconds of `fn` after a first call (which pays for first-call imports and
    allocations, as a run's first step does), over 3 calls or as many as `budget` seconds allow."""
    fn()
    times, end = [], time.perf_counter() + budget
    while not times or (len(times) < 3 and time.perf_counter() < end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------- one step


@dataclass(frozen=True)
class StepCost:
    prefill_s: float
    decode_s: float
    """The decode steps' arithmetic or memory time, whichever bounds each."""
    decode_bound: str
    """What bounds the last decode step: compute or memory."""
    host_s: float
    """Sampling's measured part (`HostTimes.decode_step` x steps): added on a CPU, overlapped on a GPU."""
    sampling_s: float
    reference_s: float
    update_s: float
    forward_s: float
    """One inference pass over the batch: what a pipelined run's proximal policy adds."""
    sync_s: float

    @property
    def learning_s(self) -> float:
        return self.reference_s + self.update_s

    @property
    def step_s(self) -> float:
        return self.sampling_s + self.sync_s + self.learning_s


def dtype_bytes(cfg: Config) -> int:
    return 2 if cfg.model.dtype in ("bfloat16", "float16") else 4


def with_host(hw: Hardware, device_s: float, host_s: float) -> float:
    """A phase's seconds: a GPU runs while its host queues more work; on a CPU they take turns."""
    return max(device_s, host_s) if hw.accelerator else device_s + host_s


def sampling_seconds(model: ModelFacts, hw: Hardware, work: Workload, lora: LoraConfig, dtype: int,
                     host_per_step: float) -> tuple[float, float, str, float, float]:
    """(prefill, decode, decode bound, host, total) seconds of sampling `work`, in chunks of
    Policy's MAX_BATCH rows, for work.new_tokens steps (the longest row's) with the rows' mean
    share of them live. Attention's FLOPs and the vocabulary's bytes count on a GPU only: on a CPU
    the measured part holds them."""
    from postrl.sampling.policy import MAX_BATCH

    p, c, attention = work.prompt_tokens, work.new_tokens, float(hw.accelerator)
    live = work.completion_tokens / c  # rows still generating, on average: finished rows leave the batch
    adapters = 0 if model.fused(lora) else model.adapters(lora)  # fused: folded into the weights per call
    weights = (model.matmul + model.head + adapters) * dtype
    prefill = (work.prompts * (2 * model.matmul * p + attention * model.attention_flops(p, p / 2)) / hw.flops
               + work.prompts * 2 * model.head / hw.rate("head"))
    decode, bound, chunks = 0.0, "compute", math.ceil(work.rows / MAX_BATCH)
    for t in range(1, c):  # the first token comes from the prefill's logits, the last is never fed back
        for rows in [MAX_BATCH * live] * (chunks - 1) + [(work.rows - MAX_BATCH * (chunks - 1)) * live]:
            body = rows * (2 * (model.matmul + adapters) + attention * model.attention_flops(1, p + t))
            compute = body / hw.rate("decode") + rows * 2 * model.head / hw.rate("head")
            memory = (weights + rows * (model.kv_bytes(dtype) * (p + t) + attention * model.vocab_bytes)) / hw.bytes_per_s
            decode += max(compute, memory)
            bound = "compute" if compute >= memory else "memory"
    host = host_per_step * c * chunks
    return prefill, decode, bound, host, with_host(hw, prefill + decode, host)


@dataclass(frozen=True)
class PassFlops:
    """FLOPs of a learner pass over the step's batch: the decoder's and the vocabulary head's
    (whose chunks of a few dozen rows through V outputs run at their own rate on a CPU)."""

    body: float
    head: float

    def seconds(self, hw: Hardware) -> float:
        return self.body / hw.flops + self.head / hw.rate("head")


def learner_flops(cfg: Config, model: ModelFacts, work: Workload, attention: bool = True) -> tuple[PassFlops, PassFlops]:
    """(one forward pass, one epoch of the update) over the step's batch; `attention`: count
    attention's FLOPs (on a CPU the measured part holds it)."""
    lora, fused = cfg.model.lora, model.fused(cfg.model.lora)
    body, head = work.body_tokens(fused), work.rows * work.completion_tokens
    trained = work.body_tokens(fused, cfg.train.minibatches)
    context = (work.prompt_tokens + work.new_tokens) / 2
    forward = PassFlops(2 * model.matmul * body + attention * model.attention_flops(body, context), 2 * model.head * head)
    per_body = (4 if lora.r > 0 else 6) + (2 if cfg.model.gradient_checkpointing else 0)
    per_head = 6 if lora.r > 0 else 8  # the head's chunks run forward twice: once more in the backward
    update = PassFlops((per_body * model.matmul + 6 * model.adapters(lora)) * trained
                       + 3 * attention * model.attention_flops(trained, context), per_head * model.head * head)
    return forward, update


def extra_forwards(cfg: Config) -> int:
    """Inference passes a step adds: the proximal policy of stale batches (decoupled PPO), or the
    learner's log-probs under a rollout correction (an inference engine's numerics)."""
    from postrl.sampling.backends import SAMPLING_BACKENDS

    mode = cfg.rl.rollout_correction.mode
    learner_numerics = SAMPLING_BACKENDS.facts(cfg.rollout.backend).learner_numerics
    corrected = mode != "none" and not (mode == "auto" and learner_numerics)
    stale = cfg.pipeline.max_staleness > 0 and cfg.pipeline.proximal == "trainer"
    return int(corrected or stale)


def sync_bytes(cfg: Config, model: ModelFacts) -> float:
    """Weight bytes copied to the sampler once per step: none where postrl's engine samples with the
    learner's own tensors; the whole state otherwise (vLLM gets LoRA merged into the weights;
    sampler processes, Ray actors and the asynchronous thread's frozen copy get every tensor)."""
    shared = (cfg.rollout.backend == "postrl" and cfg.engine == "local" and cfg.pipeline.samplers == 0
              and cfg.pipeline.max_staleness == 0)
    return 0.0 if shared else (model.params + model.adapters(cfg.model.lora)) * dtype_bytes(cfg)


def step_cost(cfg: Config, model: ModelFacts, work: Workload, hw: Hardware, host: HostTimes) -> StepCost:
    """Seconds of one step's phases on `hw` (formulas in the module docstring)."""
    dtype, lora = dtype_bytes(cfg), cfg.model.lora
    prefill, decode, bound, host_s, sampling = sampling_seconds(model, hw, work, lora, dtype, host.decode_step)
    forward, epoch = learner_flops(cfg, model, work, attention=hw.accelerator)
    vocab_s = work.rows * work.completion_tokens * model.vocab_bytes / hw.bytes_per_s if hw.accelerator else 0.0
    forward_s = with_host(hw, forward.seconds(hw) + vocab_s, host.reference)
    trainable = model.adapters(lora) if lora.r > 0 else model.params
    # AdamW per optimiser step reads weight, gradient and both moments and writes three: ~32 bytes a weight
    optimiser = cfg.train.ppo_epochs * cfg.train.minibatches * 32 * trainable / hw.bytes_per_s
    epochs = cfg.train.ppo_epochs * (epoch.seconds(hw) + 2 * vocab_s)
    update_s = with_host(hw, epochs, host.update) + optimiser + extra_forwards(cfg) * forward_s
    reference_s = forward_s if cfg.rl.kl_coef > 0 else host.reference
    return StepCost(
        prefill_s=prefill, decode_s=decode, decode_bound=bound, host_s=host_s, sampling_s=sampling,
        reference_s=reference_s, update_s=update_s,
        forward_s=forward_s, sync_s=2 * sync_bytes(cfg, model) / hw.bytes_per_s)


def eval_seconds(cfg: Config, model: ModelFacts, work: Workload, hw: Hardware, host_per_step: float) -> float:
    """One eval: per domain, a greedy reply and eval.samples_per_problem samples to each of
    eval.num_problems held-out problems, at the step's prompt length and max_new_tokens."""
    total = 0.0
    for samples in (1, cfg.eval.samples_per_problem):
        shape = Workload(cfg.eval.num_problems, samples, work.prompt_tokens, work.new_tokens, work.completion_tokens)
        total += sampling_seconds(model, hw, shape, cfg.model.lora, dtype_bytes(cfg), host_per_step)[-1]
    return len(cfg.eval.domains or cfg.domains) * total


def evals_in_run(cfg: Config) -> int:
    """Evals a run makes: every eval.every_steps steps before the last, the final one, and at start."""
    every = cfg.eval.every_steps
    return ((cfg.train.total_steps - 1) // every if every else 0) + 1 + int(cfg.eval.at_start)


# ---------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Memory:
    """Bytes one learner rank holds at its peak."""

    weights: float
    reference: float
    """A frozen copy of the initial weights for the KL term (none with LoRA: the adapters are switched off)."""
    gradients: float
    moments: float
    """AdamW's two moments, float32."""
    masters: float
    """float32 master weights of bf16 training (`postrl.learner.precision`)."""
    activations: float
    """Kept for the backward over one micro-batch, plus the vocabulary head's logits chunks."""
    kv_cache: float
    """Sampling's KV cache, on the same device between updates."""

    @property
    def total(self) -> float:
        """Weights and optimiser state stay; gradients and activations live during the update, the
        KV cache during sampling."""
        steady = self.weights + self.reference + self.moments + self.masters
        return steady + max(self.gradients + self.activations, self.kv_cache)


def memory_per_rank(cfg: Config, model: ModelFacts, work: Workload, lora: LoraConfig, ranks: int = 1,
                    sharded: bool = False, accelerator: bool = True) -> Memory:
    """Memory of one of `ranks` learner ranks training with `lora` (r 0: every weight), with the
    parameters, gradients and optimiser state replicated on each rank or sharded N ways (FSDP), on
    an accelerator or the CPU (their default logits chunks differ)."""
    dtype = dtype_bytes(cfg)
    share = ranks if sharded else 1
    adapters = model.adapters(lora)
    trainable = adapters if lora.r > 0 else model.params
    width = work.prompt_tokens + work.new_tokens
    tokens = micro_rows(cfg, max(1, work.rows // cfg.train.minibatches // ranks), width) * width  # a rank's share
    per_layer = ACTIVATION_VALUES[0] * model.hidden + ACTIVATION_VALUES[1] * model.intermediate
    if cfg.model.gradient_checkpointing:  # each layer's input kept; one layer's activations live at a time
        kept = tokens * (model.layers * model.hidden + per_layer) * dtype
    else:
        kept = tokens * model.layers * per_layer * dtype
    chunk = logits_chunk_mib(cfg.model.logits_chunk_mib, torch.device("cuda" if accelerator else "cpu"))
    logits = 3 * chunk * 2**20  # a chunk of float32 logits, its softmax and its gradient
    return Memory(
        weights=(model.params + adapters) * dtype / share,
        reference=model.params * dtype / share if lora.r <= 0 and cfg.rl.kl_coef > 0 else 0.0,
        gradients=trainable * dtype / share, moments=8 * trainable / share,
        masters=4 * trainable / share if dtype == 2 else 0.0, activations=kept + logits,
        kv_cache=work.rows * width * model.kv_bytes(dtype))
