"""The model and the step's shape, as the cost formulas take them: the model's sizes from its
config (built on the meta device: no weight is read), the step's prompts, samples and token counts.
It knows no hardware.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from postrl.config.schema import Config, LoraConfig, RolloutConfig
from postrl.model.fastlm import COVERED
from postrl.model.logprobs import chunk_rows, logits_chunk_mib

VOCAB_PASSES = 8
"""float32 passes over a position's logits: in sampling the draw's log-softmax, exp, cumulative sum
and search; in the learner the chunked head's logits, log-sum-exp and the gathered token (and, in
the update, their recomputation and gradients: twice that)."""


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
    tied: bool = True
    """Whether the vocabulary head is the embedding matrix (in `params` once); untied, `params`
    holds it apart, and a value model, which never runs it, leaves it untrained."""

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

    def value_trained(self, lora: LoraConfig) -> int:
        """Weights a value model on this one trains (`postrl.learner.critic.ValueModel.trained`): its
        head, hidden + 1, and the backbone's (with LoRA its adapters; else every weight but an untied
        vocabulary head, which it never runs)."""
        backbone = self.adapters(lora) if lora.r > 0 else self.params - (0 if self.tied else self.head)
        return backbone + self.hidden + 1


def model_facts(cfg: Config) -> tuple[ModelFacts, object]:
    """(ModelFacts, tokenizer) of the recipe's model (`facts_of`)."""
    return facts_of(cfg.model.name)


def critic_facts(cfg: Config, policy: ModelFacts) -> ModelFacts | None:
    """The critic's model (`critic.model`): None without one, the policy's for `policy` (a copy),
    else the named model's own (`facts_of`)."""
    name = cfg.critic.model
    if not name:
        return None
    return policy if name == "policy" else facts_of(name)[0]


def critic_lora(cfg: Config, lora: LoraConfig) -> LoraConfig:
    """The adapters of a critic on a policy trained with `lora`: a copy of the policy carries its
    own (its base frozen); a separate model has none and trains every weight."""
    return lora if cfg.critic.model == "policy" else LoraConfig(r=0)


def facts_of(name: str) -> tuple[ModelFacts, object]:
    """(ModelFacts, tokenizer) of the model `name` (as model.name takes it), from its config: the
    model is built on the meta device, so no weight is read or allocated (a GGUF file's metadata
    still takes seconds)."""
    from transformers import AutoModelForCausalLM

    from postrl.builtin_models import load_config_and_tokenizer

    config, tok = load_config_and_tokenizer(name)
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
        config=config, tied=head.weight is model.get_input_embeddings().weight)
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
    max_batch: int = RolloutConfig().max_num_seqs
    """Rows sampled at once (rollout.max_num_seqs): a step of more rows samples in chunks of this many."""

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
                    min(completion_tokens or limit, limit), max_batch=cfg.rollout.max_num_seqs)


def matmul_shapes(cfg: Config, model: ModelFacts, work: Workload) -> dict[str, tuple[int, int, int]]:
    """Rows x in x out of the step's matmuls that run below the square ones' rate on a CPU: the
    batch (at most work.max_batch rows) through the MLP's first projection ("decode"), and at
    most a logits chunk's rows through the vocabulary head ("head")."""
    rows = min(work.rows, work.max_batch)
    chunk = chunk_rows(model.vocab, logits_chunk_mib(cfg.model.logits_chunk_mib, torch.device("cpu")))
    return {"decode": (rows, model.hidden, model.intermediate), "head": (min(rows, chunk), model.hidden, model.vocab)}


def micro_rows(cfg: Config, rows: int, width: float) -> int:
    """Rows of one of the learner's micro-batches out of `rows` of `width` tokens: at most
    model.micro_batch_size, and within train.max_tokens_per_microbatch (a row over it alone)."""
    size = cfg.model.micro_batch_size or rows
    if cfg.train.max_tokens_per_microbatch:
        size = min(size, max(1, int(cfg.train.max_tokens_per_microbatch // width)))
    return max(1, min(size, rows))


def dtype_bytes(cfg: Config) -> int:
    """Bytes of a weight, gradient or KV-cache value in the model's dtype: 2 in bf16 or fp16, else 4."""
    return 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
