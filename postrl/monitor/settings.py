"""Settings of the monitors and sinks: the `monitor:` section of the run config.

Plain dataclasses in the style of `postrl.config` (the docstring under each field is its help
text; a `Literal` type lists a field's choices), kept free of postrl imports so that
`postrl/config/schema.py` can hold this exact source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class EntropyCollapseConfig:
    enabled: bool = True
    """Watch mean token entropy for collapse."""
    action: str = "warn"
    """warn | stop | rollback."""
    min_entropy: float = 0.05
    """Absolute floor, nats per token."""
    min_fraction_of_initial: float = 0.1
    """Also fire below this share of the first observed entropy."""
    patience_steps: int = 3
    """Consecutive low steps before firing."""


@dataclass
class KlSpikeConfig:
    enabled: bool = True
    """Watch KL to the reference for spikes."""
    action: str = "warn"
    """warn | stop | rollback."""
    max_kl: float = 1.0
    """Absolute ceiling on kl/mean, nats per token."""
    spike_factor: float = 5.0
    """Fire when kl/mean exceeds this multiple of its running mean."""
    floor_kl: float = 0.02
    """Running means below this count as this, so noise around zero is not a spike."""
    ema_beta: float = 0.9
    """Smoothing of the running mean (higher = longer memory)."""
    warmup_steps: int = 3
    """Steps observed before the relative test applies."""


@dataclass
class LengthDriftConfig:
    enabled: bool = True
    """Watch for completions growing while the pass rate stays flat."""
    action: str = "warn"
    """warn | stop | rollback."""
    window_steps: int = 12
    """Steps compared: the first third of the window against the last third."""
    max_growth: float = 0.5
    """Relative length growth that counts as drift (0.5 = +50%)."""
    min_pass_gain: float = 0.02
    """Pass-rate gain (absolute) over the same window that would justify the growth."""


@dataclass
class VerifierDisagreementConfig:
    enabled: bool = True
    """Watch for a training metric rising while a stricter or held-out check does not follow."""
    action: str = "warn"
    """warn | stop | rollback."""
    pairs: dict[str, str] = field(default_factory=lambda: {"reward/mean": "pass_rate"})
    """Training metric -> held-out/stricter metric on a comparable scale (both in [0, 1])."""
    window_steps: int = 12
    """Steps over which each metric's rise is measured (least-squares slope x window)."""
    min_rise: float = 0.1
    """Rise of the training metric over the window that asks for confirmation."""
    min_agreement: float = 0.25
    """The held-out metric must rise by at least this share of the training metric's rise."""
    min_points: int = 3
    """Observations of each metric inside the window before judging."""


@dataclass
class FormatShareConfig:
    enabled: bool = True
    """Watch the share of positive reward earned by format-only reward terms."""
    action: str = "warn"
    """warn | stop | rollback."""
    prefixes: list[str] = field(default_factory=lambda: ["format"])
    """Reward terms whose name starts with one of these reward form, not correctness (format_boxed, ...)."""
    max_share: float = 0.5
    """Fire when these terms earn more than this share of all positive reward."""
    patience_steps: int = 2
    """Consecutive steps above the share before firing."""


@dataclass
class RepetitionConfig:
    enabled: bool = True
    """Watch for completions that repeat their own n-grams."""
    action: str = "warn"
    """warn | stop | rollback."""
    ngram: int = 4
    """n-gram length, in tokens."""
    max_repeat_fraction: float = 0.5
    """A completion is repetitive when this share of its n-grams are repeats."""
    max_repetitive_share: float = 0.25
    """Fire when more than this share of a step's completions are repetitive."""
    patience_steps: int = 2
    """Consecutive steps above the share before firing."""


@dataclass
class TamperingConfig:
    enabled: bool = True
    """Watch completions for code that tampers with the tests that grade it."""
    action: str = "warn"
    """warn | stop | rollback."""
    protected_names: list[str] = field(
        default_factory=lambda: ["check", "candidate", "AssertionError", "__eq__"]
    )
    """Names a solution must not define, assign or import as (test harness names, equality hooks)."""
    forbidden: list[str] = field(
        default_factory=lambda: [
            "sys.exit", "os._exit", "exit(", "quit(", "SystemExit", "unittest", "pytest",
            "sys._getframe", "inspect.", "setattr(", "signal.", "builtins", "__builtins__",
        ]
    )
    """Substrings (word-bounded at the start) that exit early, patch, or inspect the test harness."""
    min_samples: int = 1
    """Fire when at least this many completions in a step tamper."""


@dataclass
class NonFiniteConfig:
    enabled: bool = True
    """Watch training scalars for NaN and inf."""
    action: str = "stop"
    """warn | stop | rollback."""
    metrics: list[str] = field(default_factory=lambda: ["loss", "grad_norm"])
    """Metric names that must stay finite."""


@dataclass
class MismatchConfig:
    enabled: bool = True
    """Watch the train/inference mismatch (`mismatch/*`: the sampler's log-probs against the
    learner's on the same weights) for a broken weight sync or a bad inference engine. Skips steps
    without a measurement."""
    action: str = "warn"
    """warn | stop | rollback."""
    max_logp_abs_diff_mean: float = 0.05
    """Fire when the mean |log p_behaviour - log p_learner| per token is above this. postrl's own
    backend shows ~1e-7, a float32 inference engine up to ~1e-3, bf16 engines ~0.01 (trl#4772)."""
    max_kl_k3: float = 0.01
    """... or when the k3 estimate of KL(behaviour || learner) per token is above this (about
    (dlogp)^2 / 2 for small differences: 1e-6 at dlogp 1e-3)."""


@dataclass
class ToolLoopConfig:
    enabled: bool = True
    """Watch multi-turn episodes for the same tool call made again and again."""
    action: str = "warn"
    """warn | stop | rollback."""
    min_repeats: int = 3
    """An episode loops when one tool call (the same text) is made this many times."""
    max_share: float = 0.25
    """Fire when more than this share of a step's episodes loop."""
    patience_steps: int = 2
    """Consecutive steps above the share before firing."""


@dataclass
class ToolErrorsConfig:
    enabled: bool = True
    """Watch the share of tool calls that fail (error, timeout, malformed, unknown tool, output flood)."""
    action: str = "warn"
    """warn | stop | rollback."""
    max_rate: float = 0.5
    """Fire when a step's tool-error rate is above this..."""
    min_rise: float = 0.2
    """...or when it rose by this much (least-squares over the window) ..."""
    window_steps: int = 5
    """...over this many steps with tool calls."""


HELDOUT_AUTO = "auto"
"""In `monitor.proxy_gold.heldout_domains`: every eval-only domain graded by a trained domain's gold."""


@dataclass
class ProxyGoldConfig:
    enabled: bool = True
    """Watch a domain's trained reward (the proxy) against its monitoring-only gold scorer
    (`domains.NAME.gold`): reward-model over-optimisation. Skips steps with no gold scores."""
    action: str = "warn"
    """warn | stop | rollback."""
    heldout_domains: list[str] = field(default_factory=lambda: [HELDOUT_AUTO])
    """Eval-only domains (`eval.domains`) whose held-out gold joins each step's gold evidence, pooled
    with the trained samples' by sample count (64 problems x 4 samples add 256 scores to 128): `auto`
    = every one graded by a trained domain's gold spec (`params.verifier` equal to `domains.NAME.gold`)
    when eval.every_steps is 1; [] = the trained samples only. A named one needs eval.every_steps 1
    (a one-line error otherwise). A step whose eval is missing is skipped, not judged on the trained
    samples alone, whose gold may sit at another level."""
    smooth_steps: int = 3
    """Both series are compared as moving averages over this many steps."""
    min_gold_drop: float = 0.05
    """Fire when smoothed gold falls this far below its best so far (and more than noise_z standard
    errors of the two smoothed values, from the spread of gold over each step's samples and the
    held-out evals' standard errors) ..."""
    noise_z: float = 4.0
    """How many standard errors a drop must exceed to count as more than sampling noise."""
    min_proxy_rise: float = 0.0
    """... while smoothed proxy stands at least this far above its value at gold's best."""
    patience_steps: int = 1
    """Consecutive steps the condition must hold before firing."""


PLUGIN_SETTINGS: dict[str, type] = {}
"""Settings dataclasses of the monitors that extensions register (`register_monitor(NAME,
settings=...)`, `postrl.monitor.base`), by monitor name. A recipe sets them at
`monitor.NAME`, like a built-in monitor's; `postrl.config` parses and checks them against the
dataclass (flat fields: str, int, float, bool and lists or dicts of them) and keeps the values,
plain, in `MonitorConfig.plugins`, so a config pickles without the extension's classes."""


@dataclass
class MlflowConfig:
    tracking_uri: str = ""
    """Where the `mlflow` sink logs (sqlite:///PATH/mlflow.db, http://HOST:5000, ...); empty: the
    MLFLOW_TRACKING_URI variable, else mlflow's default (sqlite:///mlflow.db in the working directory)."""
    experiment: str = ""
    """MLflow experiment, created when missing; empty: MLFLOW_EXPERIMENT_NAME, else 'postrl'."""
    artifact_location: str = ""
    """Where a new experiment keeps its artifacts; empty: mlartifacts/ beside a sqlite database,
    else the tracking server's default."""
    log_model: bool = True
    """Upload final/ (the trained model directory) as an artifact when the run ends."""


@dataclass
class WandbConfig:
    project: str = ""
    """W&B project; empty: the WANDB_PROJECT variable, else 'postrl'."""
    entity: str = ""
    """W&B team or user; empty: WANDB_ENTITY, else your default entity."""
    mode: Literal["", "online", "offline", "disabled"] = ""
    """online | offline | disabled; empty: WANDB_MODE, else wandb's default (online)."""
    log_model: bool = True
    """Upload final/ (the trained model directory) as an artifact when the run ends."""


@dataclass
class MonitorConfig:
    sinks: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Metric sinks besides metrics.jsonl (always written): tensorboard, mlflow, wandb."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """Settings of the `mlflow` sink (read only when monitor.sinks names it)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Settings of the `wandb` sink (read only when monitor.sinks names it)."""
    spot_check_every_steps: int = 10
    """Dump highest/lowest/random samples to samples/step_N.md every N steps (0 = never)."""
    spot_check_k: int = 3
    """Samples of each kind (highest, lowest, random) per spot check."""
    rollback_lr_factor: float = 0.5
    """On a `rollback` alert the learning rate is multiplied by this after restoring a checkpoint (the
    newest, or the one nearest the step the alert names: `postrl.run.rollback_target`)."""
    max_rollbacks: int = 2
    """Rollbacks allowed in one run; past this a rollback alert stops the run instead."""
    entropy_collapse: EntropyCollapseConfig = field(default_factory=EntropyCollapseConfig)
    kl_spike: KlSpikeConfig = field(default_factory=KlSpikeConfig)
    length_drift: LengthDriftConfig = field(default_factory=LengthDriftConfig)
    verifier_disagreement: VerifierDisagreementConfig = field(default_factory=VerifierDisagreementConfig)
    format_share: FormatShareConfig = field(default_factory=FormatShareConfig)
    repetition: RepetitionConfig = field(default_factory=RepetitionConfig)
    test_tampering: TamperingConfig = field(default_factory=TamperingConfig)
    non_finite: NonFiniteConfig = field(default_factory=NonFiniteConfig)
    mismatch: MismatchConfig = field(default_factory=MismatchConfig)
    proxy_gold: ProxyGoldConfig = field(default_factory=ProxyGoldConfig)
    tool_loop: ToolLoopConfig = field(default_factory=ToolLoopConfig)
    tool_errors: ToolErrorsConfig = field(default_factory=ToolErrorsConfig)
    plugins: dict[str, dict] = field(default_factory=dict)
    """Settings of extension monitors, {name: values}: written `monitor.NAME` in a recipe (see
    PLUGIN_SETTINGS); read as `cfg.monitor.NAME` like a built-in monitor's."""

    EXTENSIONS = PLUGIN_SETTINGS  # not a field: the extra sections `postrl.config.loading.from_dict` accepts

    def __getattr__(self, name: str):  # only reached for a name that is not a field
        settings = PLUGIN_SETTINGS.get(name)
        if settings is None or name == "plugins":
            raise AttributeError(name)
        return settings(**self.__dict__.get("plugins", {}).get(name, {}))
